SELECT EXTRACT(epoch
               FROM statement_timestamp() - first.run_at) AS seconds,
       first.queue,
       first.kind
FROM generate_series(0, 9) AS levels(level)
JOIN LATERAL
  (SELECT jobs.run_at AS run_at,
          jobs.queue AS queue,
          jobs.kind AS kind
   FROM jobs
   WHERE jobs.status = 'queued'::job_status
     AND jobs.priority = levels.level
     AND jobs.run_at <= statement_timestamp()
   ORDER BY jobs.run_at
   LIMIT %(param_1)s::INTEGER) AS first ON true
ORDER BY first.run_at
LIMIT %(param_2)s::INTEGER;
