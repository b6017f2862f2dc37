SELECT jobs.queue,
       jobs.kind,
       count(*) FILTER (
                        WHERE jobs.run_at <= now()) AS ready,
       count(*) FILTER (
                        WHERE jobs.run_at > now()) AS scheduled,
       EXTRACT(epoch
               FROM now() - (min(jobs.run_at) FILTER (
                                                      WHERE jobs.run_at <= now()))) AS oldest_ready
FROM jobs
WHERE jobs.status = 'queued'::job_status
GROUP BY jobs.queue,
         jobs.kind;
