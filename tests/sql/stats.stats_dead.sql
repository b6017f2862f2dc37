SELECT jobs.queue,
       jobs.kind,
       count(*) FILTER (
                        WHERE jobs.status = 'dead'::job_status) AS dead,
       count(*) FILTER (
                        WHERE jobs.status = 'cancelled'::job_status) AS cancelled
FROM jobs
WHERE jobs.status IN ('dead'::job_status,
                      'cancelled'::job_status)
GROUP BY jobs.queue,
         jobs.kind;
