UPDATE jobs
SET status='running'::job_status,
    attempts=(jobs.attempts + %(attempts_1)s::INTEGER),
    max_attempts=coalesce(jobs.max_attempts, %(handler_max_attempts)s::INTEGER),
    worker=%(worker)s::VARCHAR
WHERE jobs.id = %(id)s::BIGINT RETURNING jobs.attempts,
                                         jobs.max_attempts;
