UPDATE jobs
SET status='done'::job_status,
    run_at=least(jobs.run_at, now()),
    locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                       finished_at=now(),
                                                       result=CAST(%(result)s::VARCHAR AS JSONB)
WHERE jobs.id = %(id)s::BIGINT;
