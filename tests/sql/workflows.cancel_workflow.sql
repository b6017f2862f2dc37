UPDATE jobs
SET status='cancelled'::job_status,
    locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                       last_error=%(note)s::VARCHAR,
                                                       finished_at=statement_timestamp()
WHERE jobs.workflow_id = %(workflow_id)s::UUID
  AND jobs.status IN ('waiting'::job_status,
                      'queued'::job_status) RETURNING jobs.id;
