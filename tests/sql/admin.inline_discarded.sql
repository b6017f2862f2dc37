UPDATE jobs
SET status='cancelled'::job_status,
    attempts=(jobs.attempts + %(attempts_1)s::INTEGER),
    max_attempts=coalesce(jobs.max_attempts, %(handler_max_attempts)s::INTEGER),
    worker=%(worker)s::VARCHAR,
    last_error=%(error)s::VARCHAR,
    finished_at=statement_timestamp()
WHERE jobs.id = %(id)s::BIGINT;
