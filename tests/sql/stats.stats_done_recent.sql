SELECT jobs.queue,
       jobs.kind,
       count(*) FILTER (
                        WHERE jobs.finished_at >= statement_timestamp() - interval '1 second' * %(param_1)s) AS done_last_minute,
       count(*) AS done_last_hour
FROM jobs
WHERE jobs.status = 'done'::job_status
  AND jobs.finished_at >= statement_timestamp() - interval '1 second' * %(param_2)s
GROUP BY jobs.queue,
         jobs.kind;
