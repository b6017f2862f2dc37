UPDATE jobs
SET locked_until=(now() + interval '1 second' * %(lock_seconds)s)
FROM unnest(%(fence_ids)s::BIGINT[], %(fence_attempts)s::INTEGER[]) AS fence(id, attempt)
WHERE jobs.id = ANY (%(fence_ids)s::BIGINT[])
  AND jobs.id = fence.id
  AND jobs.attempts = fence.attempt
  AND CAST(jobs.status AS TEXT) = 'running'
  AND jobs.worker = %(fence_worker)s::VARCHAR RETURNING jobs.id,
                                                        jobs.cancel_requested_at IS NOT NULL AS cancelling;
