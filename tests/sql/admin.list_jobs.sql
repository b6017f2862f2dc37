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
WHERE jobs.status IN ('dead'::job_status)
  AND jobs.queue = %(queue)s::VARCHAR
  AND jobs.created_at < statement_timestamp() - interval '1 second' * %(older_than)s
  AND jobs.kind = ANY (%(kind)s::TEXT[])
  AND jobs.id > %(after_id)s::BIGINT
ORDER BY jobs.kind,
         jobs.id
LIMIT %(limit)s::INTEGER;
