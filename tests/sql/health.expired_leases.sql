SELECT count(*) AS expired,
       EXTRACT(epoch
               FROM statement_timestamp() - min(jobs.locked_until)) AS oldest_seconds
FROM jobs
WHERE jobs.status = 'running'::job_status
  AND jobs.locked_until < statement_timestamp() - interval '1 second' * %(grace)s;
