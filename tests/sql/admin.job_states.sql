SELECT jobs.id,
       jobs.status,
       jobs.attempts,
       jobs.max_attempts,
       jobs.cancel_requested_at
FROM jobs
WHERE jobs.id = ANY (%(ids)s::BIGINT[]);
