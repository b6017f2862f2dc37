UPDATE jobs
SET status=CASE
               WHEN (jobs.attempts + %(attempts_1)s::INTEGER >= coalesce(jobs.max_attempts, %(handler_max_attempts)s::INTEGER)) THEN 'dead'::job_status
               ELSE 'queued'::job_status
           END,
           run_at=CASE
                      WHEN (jobs.attempts + %(attempts_1)s::INTEGER >= coalesce(jobs.max_attempts, %(handler_max_attempts)s::INTEGER)) THEN least(jobs.run_at, statement_timestamp())
                      ELSE statement_timestamp() + interval '1 second' * %(delay)s
                  END,
                  attempts=(jobs.attempts + %(attempts_2)s::INTEGER),
                  max_attempts=coalesce(jobs.max_attempts, %(handler_max_attempts)s::INTEGER),
                  worker=%(worker)s::VARCHAR,
                  last_error=%(error)s::VARCHAR,
                  finished_at=CASE
                                  WHEN (jobs.attempts + %(attempts_1)s::INTEGER >= coalesce(jobs.max_attempts, %(handler_max_attempts)s::INTEGER)) THEN statement_timestamp()
                              END
WHERE jobs.id = %(id)s::BIGINT RETURNING jobs.status;
