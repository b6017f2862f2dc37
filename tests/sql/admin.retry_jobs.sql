WITH picked AS MATERIALIZED
  (SELECT jobs.id AS id
   FROM jobs
   WHERE jobs.id = ANY (%(param_1)s::BIGINT[])
     AND jobs.status IN ('dead'::job_status)
     FOR
     UPDATE SKIP LOCKED)
UPDATE jobs
SET status='queued'::job_status,
    run_at=statement_timestamp(),
    locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                       attempts=%(attempts)s::INTEGER,
                                                       worker=%(worker)s::VARCHAR,
                                                       finished_at=%(finished_at)s::TIMESTAMP WITH TIME ZONE,
                                                                                                        snoozes=%(snoozes)s::INTEGER,
                                                                                                        cancel_requested_at=%(cancel_requested_at)s::TIMESTAMP WITH TIME ZONE
FROM picked
WHERE jobs.id = picked.id RETURNING jobs.id,
                                    jobs.workflow_id;
