SELECT count(*) AS count_1
FROM jobs_workers
WHERE jobs_workers.heartbeat_at >= statement_timestamp() - interval '1 second' * %(max_age)s
  AND jobs_workers.expires_at >= statement_timestamp();
