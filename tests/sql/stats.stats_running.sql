SELECT jobs.queue,
       jobs.kind,
       count(*) AS running,
       count(*) FILTER (
                        WHERE jobs.locked_until < statement_timestamp()) AS expired
FROM jobs
WHERE jobs.status = 'running'::job_status
GROUP BY jobs.queue,
         jobs.kind;
