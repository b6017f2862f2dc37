WITH done AS
  (UPDATE jobs
   SET status='done'::job_status,
       locked_until=NULL,
       finished_at=statement_timestamp(),
       result=CAST(%(result)s::VARCHAR AS JSONB)
   WHERE jobs.id = %(job_id)s::BIGINT
     AND jobs.attempts = %(attempt)s::INTEGER
     AND CAST(jobs.status AS TEXT) = 'running'
     AND jobs.worker = %(fence_worker)s::VARCHAR RETURNING jobs.id)
SELECT CAST(CASE
                WHEN (count(*) = 1) THEN '1'
                ELSE concat('sqla_jobs: claim lost ', count(*))
            END AS INTEGER) AS done
FROM done;
