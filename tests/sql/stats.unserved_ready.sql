SELECT oldest.kind,
       oldest.queue,
       count(*) AS ready
FROM generate_series(0, 9) AS levels(level)
JOIN LATERAL
  (SELECT jobs.kind AS kind,
          jobs.queue AS queue
   FROM jobs
   WHERE jobs.status = 'queued'::job_status
     AND jobs.priority = levels.level
     AND jobs.run_at <= statement_timestamp()
   ORDER BY jobs.run_at
   LIMIT %(look)s::INTEGER) AS oldest ON true
WHERE oldest.kind = ANY (%(param_1)s::TEXT[])
  AND oldest.queue != ALL (%(param_2)s::TEXT[])
GROUP BY oldest.kind,
         oldest.queue
ORDER BY oldest.kind,
         oldest.queue;
