WITH picked AS MATERIALIZED
  (SELECT jobs.id AS id
   FROM jobs
   WHERE (jobs.status = 'done'::job_status
          AND jobs.finished_at < statement_timestamp() - interval '1 second' * %(done_age)s
          OR jobs.status IN ('dead'::job_status,
                             'cancelled'::job_status)
          AND jobs.finished_at < statement_timestamp() - interval '1 second' * %(dead_age)s)
     AND NOT (jobs.workflow_id IS NOT NULL
              AND (EXISTS
                     (SELECT *
                      FROM jobs AS step
                      WHERE step.workflow_id = jobs.workflow_id
                        AND step.status IN ('waiting'::job_status,
                                            'queued'::job_status,
                                            'running'::job_status))))
   LIMIT %(batch)s::INTEGER
   FOR UPDATE SKIP LOCKED), moved AS
  (DELETE
   FROM jobs USING picked
   WHERE jobs.id = picked.id RETURNING jobs.id,
                                       jobs.kind,
                                       jobs.queue,
                                       jobs.priority,
                                       jobs.payload,
                                       jobs.status,
                                       jobs.run_at,
                                       jobs.locked_until,
                                       jobs.attempts,
                                       jobs.max_attempts,
                                       jobs.idempotency_key,
                                       jobs.worker,
                                       jobs.last_error,
                                       jobs.created_at,
                                       jobs.finished_at,
                                       jobs.result,
                                       jobs.timeout,
                                       jobs.snoozes,
                                       jobs.cancel_requested_at,
                                       jobs.attempted_at,
                                       jobs.errors,
                                       jobs.meta,
                                       jobs.tags,
                                       jobs.workflow_id,
                                       jobs.step)
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, locked_until, attempts, max_attempts, idempotency_key, worker, last_error, created_at, finished_at, result, timeout, snoozes, cancel_requested_at, attempted_at, errors, meta, tags, workflow_id, step, archived_at)
SELECT moved.id,
       moved.kind,
       moved.queue,
       moved.priority,
       moved.payload,
       moved.status,
       moved.run_at,
       moved.locked_until,
       moved.attempts,
       moved.max_attempts,
       moved.idempotency_key,
       moved.worker,
       moved.last_error,
       moved.created_at,
       moved.finished_at,
       moved.result,
       moved.timeout,
       moved.snoozes,
       moved.cancel_requested_at,
       moved.attempted_at,
       moved.errors,
       moved.meta,
       moved.tags,
       moved.workflow_id,
       moved.step,
       statement_timestamp() AS statement_timestamp_1
FROM moved RETURNING jobs_archive.id;
