SELECT EXTRACT(epoch
               FROM min(next.run_at) - statement_timestamp()) AS anon_1
FROM generate_series(0, 9) AS levels(level)
JOIN LATERAL
  (SELECT jobs.run_at AS run_at
   FROM jobs
   WHERE jobs.status = 'queued'::job_status
     AND jobs.priority = levels.level
     AND jobs.run_at > statement_timestamp()
     AND jobs.queue = ANY (%(queues)s::TEXT[])
     AND jobs.kind = ANY (%(kinds)s::TEXT[])
   ORDER BY jobs.run_at
   LIMIT %(param_1)s::INTEGER) AS next ON true;
