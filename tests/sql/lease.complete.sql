UPDATE jobs
SET status='done'::job_status,
    locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                       finished_at=now()
FROM unnest(%(fence_ids)s::BIGINT[], %(fence_attempts)s::INTEGER[]) AS fence(id, attempt)
WHERE jobs.id = ANY (%(fence_ids)s::BIGINT[])
  AND jobs.id = fence.id
  AND jobs.attempts = fence.attempt
  AND CAST(jobs.status AS TEXT) = 'running'
  AND jobs.worker = %(fence_worker)s::VARCHAR RETURNING jobs.id;
