WITH picked AS MATERIALIZED
  (SELECT jobs.id AS id,
          jobs.workflow_id AS workflow_id,
          jobs.status AS status,
          jobs.finished_at AS finished_at
   FROM jobs
   WHERE jobs.status = 'done'::job_status
     AND jobs.finished_at >= coalesce(%(floor_done)s::TIMESTAMP WITH TIME ZONE, '-infinity'::timestamptz)
     AND jobs.finished_at < statement_timestamp() - interval '1 second' * %(done_age)s
     AND (jobs.workflow_id IS NULL
          OR NOT (jobs.workflow_id IS NOT NULL
                  AND
                    (SELECT 1
                     FROM jobs AS other_step
                     WHERE other_step.workflow_id = jobs.workflow_id
                       AND other_step.status IN ('waiting'::job_status,
                                                 'queued'::job_status,
                                                 'running'::job_status)
                     LIMIT %(param_1)s::INTEGER) IS NOT NULL)
          AND
            (SELECT max(last_step.finished_at) AS max_1
             FROM jobs AS last_step
             WHERE last_step.workflow_id = jobs.workflow_id) < statement_timestamp() - interval '1 second' * %(done_age)s
          AND
            (SELECT 1
             FROM jobs AS other_step
             WHERE other_step.workflow_id = jobs.workflow_id
               AND other_step.status IN ('dead'::job_status,
                                         'cancelled'::job_status)
             LIMIT %(param_2)s::INTEGER) IS NULL)
   ORDER BY jobs.finished_at
   LIMIT %(batch)s::INTEGER
   FOR UPDATE SKIP LOCKED), units AS MATERIALIZED
  (SELECT DISTINCT picked.workflow_id AS workflow_id
   FROM picked
   WHERE picked.workflow_id IS NOT NULL), unit_steps AS MATERIALIZED
  (SELECT jobs.id AS id,
          jobs.workflow_id AS workflow_id,
          jobs.status = 'done'::job_status
   AND jobs.finished_at < statement_timestamp() - interval '1 second' * %(done_age)s AS goes
   FROM jobs
   WHERE jobs.workflow_id = ANY (array(
                                         (SELECT units.workflow_id
                                          FROM units)))
     FOR
     UPDATE OF jobs SKIP LOCKED), chosen AS MATERIALIZED
  (SELECT picked.id AS id
   FROM picked
   WHERE picked.workflow_id IS NULL
   UNION ALL SELECT unit_steps.id AS id
   FROM unit_steps
   WHERE unit_steps.workflow_id IN
       (SELECT unit_steps.workflow_id
        FROM unit_steps
        GROUP BY unit_steps.workflow_id
        HAVING bool_and(unit_steps.goes)
        AND count(*) =
          (SELECT count(*) AS count_1
           FROM jobs AS any_step
           WHERE any_step.workflow_id = unit_steps.workflow_id))), moved AS
  (DELETE
   FROM jobs USING chosen
   WHERE jobs.id = chosen.id RETURNING jobs.id,
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
                                       jobs.step,
                                       jobs.workflow_leaf)
INSERT INTO jobs_archive (id, kind, queue, priority, payload, status, run_at, locked_until, attempts, max_attempts, idempotency_key, worker, last_error, created_at, finished_at, result, timeout, snoozes, cancel_requested_at, attempted_at, errors, meta, tags, workflow_id, step, workflow_leaf, archived_at)
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
       moved.workflow_leaf,
       statement_timestamp() AS statement_timestamp_1
FROM moved RETURNING jobs_archive.id,

  (SELECT max(picked.finished_at) AS max_2
   FROM picked
   WHERE picked.status = 'done'::job_status) AS reached_done;
