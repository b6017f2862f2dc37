WITH picked AS MATERIALIZED
  (SELECT jobs.id AS id
   FROM jobs
   WHERE jobs.status IN ('queued'::job_status,
                         'waiting'::job_status)
     AND jobs.kind = %(kind)s::VARCHAR
     FOR
     UPDATE SKIP LOCKED)
UPDATE jobs
SET status='cancelled'::job_status,
    locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                       last_error=(%(note)s::VARCHAR || CAST(jobs.status AS TEXT) || coalesce(%(earlier)s::VARCHAR || jobs.last_error, %(coalesce_1)s::VARCHAR)),
                                                       finished_at=statement_timestamp()
FROM picked
WHERE jobs.id = picked.id
  AND jobs.status IN ('queued'::job_status,
                      'waiting'::job_status) RETURNING jobs.id;
