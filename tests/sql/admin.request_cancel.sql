WITH marked AS
  (UPDATE jobs
   SET cancel_requested_at=statement_timestamp()
   WHERE jobs.id = ANY (%(param_1)s::BIGINT[])
     AND jobs.status IN ('running'::job_status)
     AND jobs.cancel_requested_at IS NULL RETURNING jobs.id)
SELECT marked.id,
       pg_notify(%(channel)s::VARCHAR, CAST(marked.id AS TEXT)) AS notified
FROM marked
ORDER BY marked.id;
