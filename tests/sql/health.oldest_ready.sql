SELECT EXTRACT(epoch
               FROM statement_timestamp() - min(first.run_at)) AS anon_1
FROM generate_series(0, 9) AS levels(level)
JOIN LATERAL
  (SELECT jobs.run_at AS run_at
   FROM jobs
   WHERE jobs.status = 'queued'::job_status
     AND jobs.priority = levels.level
     AND jobs.run_at <= statement_timestamp()
   ORDER BY jobs.run_at
   LIMIT %(param_1)s::INTEGER) AS first ON true;
