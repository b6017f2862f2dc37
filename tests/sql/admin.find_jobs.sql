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
WHERE jobs.status IN ('queued'::job_status)
  AND jobs.kind = %(kind)s::VARCHAR
  AND jobs.queue = %(queue)s::VARCHAR
  AND jobs.priority = %(priority)s::SMALLINT
  AND jobs.payload @> CAST(%(payload_match)s::VARCHAR AS JSONB)
ORDER BY jobs.id
LIMIT %(limit)s::INTEGER;
