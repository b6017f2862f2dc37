SELECT jobs_workers.id,
       jobs_workers.host,
       jobs_workers.pid,
       jobs_workers.heartbeat_at,
       EXTRACT(epoch
               FROM statement_timestamp() - jobs_workers.heartbeat_at) AS age_seconds,
       jobs_workers.expires_at
FROM jobs_workers
WHERE jobs_workers.heartbeat_at < statement_timestamp() - interval '1 second' * %(max_age)s
ORDER BY jobs_workers.heartbeat_at;
