SELECT jobs.queue,
       jobs.kind,
       count(*) AS waiting
FROM jobs
WHERE jobs.status = 'waiting'::job_status
GROUP BY jobs.queue,
         jobs.kind;
