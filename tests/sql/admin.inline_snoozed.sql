UPDATE jobs
SET status='queued'::job_status,
    run_at=(statement_timestamp() + interval '1 second' * %(delay)s),
    last_error=%(error)s::VARCHAR,
    snoozes=(jobs.snoozes + %(snoozes_1)s::INTEGER)
WHERE jobs.id = %(id)s::BIGINT;
