UPDATE jobs
SET status='running'::job_status,
    attempts=(jobs.attempts + %(attempts_1)s::INTEGER),
    worker=%(worker)s::VARCHAR
WHERE jobs.id = %(id)s::BIGINT RETURNING jobs.attempts;
