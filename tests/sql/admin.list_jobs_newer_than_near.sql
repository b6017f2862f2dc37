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
       jobs.step
FROM jobs
WHERE jobs.created_at >= statement_timestamp() - interval '1 second' * %(newer_than)s
  AND jobs.id <= %(after_id)s::BIGINT + %(window)s::BIGINT
  AND jobs.id > %(after_id)s::BIGINT
ORDER BY jobs.id
LIMIT %(limit)s::INTEGER;
