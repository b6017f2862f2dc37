UPDATE jobs
SET status='done'::job_status,
    run_at=least(jobs.run_at, now()),
    locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                       finished_at=now()
WHERE jobs.id = %(id)s::BIGINT;
