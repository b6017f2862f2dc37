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
       jobs.finished_at
FROM jobs
WHERE jobs.id = %(id)s::BIGINT;
