SELECT jobs.id,
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
       jobs.workflow_leaf
FROM jobs
WHERE jobs.kind = ANY (%(param_1)s::TEXT[])
  AND jobs.status = 'queued'::job_status
  AND jobs.run_at <= statement_timestamp()
ORDER BY jobs.priority,
         jobs.run_at,
         jobs.id
LIMIT %(param_2)s::INTEGER
FOR
UPDATE SKIP LOCKED;
