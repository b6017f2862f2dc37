SELECT newest.queue,
       newest.kind,
       count(*) FILTER (
                        WHERE newest.status = 'queued'::job_status
                          AND newest.run_at <= statement_timestamp()) AS ready,
       count(*) FILTER (
                        WHERE newest.status = 'queued'::job_status
                          AND NOT (newest.status = 'queued'::job_status
                                   AND newest.run_at <= statement_timestamp())) AS scheduled,
       count(*) FILTER (
                        WHERE newest.status = 'waiting'::job_status) AS waiting,
       count(*) FILTER (
                        WHERE newest.status = 'dead'::job_status) AS dead,
       count(*) FILTER (
                        WHERE newest.status = 'cancelled'::job_status) AS cancelled,
       EXTRACT(epoch
               FROM statement_timestamp() - (min(newest.run_at) FILTER (
                                                                        WHERE newest.status = 'queued'::job_status
                                                                          AND newest.run_at <= statement_timestamp()))) AS oldest_ready
FROM
  (SELECT jobs.queue AS queue,
          jobs.kind AS kind,
          jobs.status AS status,
          jobs.run_at AS run_at
   FROM jobs
   WHERE jobs.status = ANY (ARRAY['queued'::job_status])
   ORDER BY jobs.status DESC,
            jobs.id DESC
   LIMIT %(size)s::INTEGER) AS newest
GROUP BY newest.queue,
         newest.kind;
