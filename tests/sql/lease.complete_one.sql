UPDATE jobs
SET status='done'::job_status,
    locked_until=NULL,
    finished_at=statement_timestamp(),
    result=CAST(%(result)s::VARCHAR AS JSONB)
WHERE jobs.id = %(job_id)s::BIGINT
  AND jobs.attempts = %(attempt)s::INTEGER
  AND CAST(jobs.status AS TEXT) = 'running'
  AND jobs.worker = %(fence_worker)s::VARCHAR;
