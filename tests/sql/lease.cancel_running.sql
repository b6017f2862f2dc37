UPDATE jobs
SET status='cancelled'::job_status,
    locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                       last_error=%(error)s::VARCHAR,
                                                       finished_at=now()
FROM unnest(%(fence_ids)s::BIGINT[], %(fence_attempts)s::INTEGER[]) AS fence(id, attempt)
WHERE jobs.id = ANY (%(fence_ids)s::BIGINT[])
  AND jobs.id = fence.id
  AND jobs.attempts = fence.attempt
  AND CAST(jobs.status AS TEXT) = 'running'
  AND jobs.worker = %(fence_worker)s::VARCHAR RETURNING jobs.id,
                                                        jobs.status;
