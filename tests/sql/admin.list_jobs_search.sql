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
WHERE jobs.idempotency_key = %(key)s::VARCHAR
  AND jobs.id >= %(min_id)s::BIGINT
  AND jobs.id <= %(max_id)s::BIGINT
  AND jobs.created_at >= statement_timestamp() - interval '1 second' * %(newer_than)s
  AND jobs.payload @> CAST(%(payload_match)s::VARCHAR AS JSONB)
  AND jobs.id < %(after_id)s::BIGINT
  AND jobs.id >= %(after_id)s::BIGINT - %(window)s::BIGINT
ORDER BY jobs.id DESC
LIMIT %(limit)s::INTEGER;
