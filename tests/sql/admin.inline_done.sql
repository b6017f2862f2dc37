UPDATE jobs
SET status='done'::job_status,
    run_at=least(jobs.run_at, statement_timestamp()),
    locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                       finished_at=statement_timestamp(),
                                                       result=CAST(%(result)s::VARCHAR AS JSONB)
WHERE jobs.id = %(id)s::BIGINT;
