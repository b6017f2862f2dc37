SELECT jobs.queue,
       jobs.kind,
       count(*) FILTER (
                        WHERE jobs.run_at <= statement_timestamp()) AS ready,
       count(*) FILTER (
                        WHERE jobs.run_at > statement_timestamp()) AS scheduled,
       EXTRACT(epoch
               FROM statement_timestamp() - (min(jobs.run_at) FILTER (
                                                                      WHERE jobs.run_at <= statement_timestamp()))) AS oldest_ready
FROM jobs
WHERE jobs.status = 'queued'::job_status
GROUP BY jobs.queue,
         jobs.kind;
