UPDATE jobs
SET status=CASE
               WHEN (jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled'::job_status
               ELSE 'queued'::job_status
           END,
           locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                              attempts=(jobs.attempts - %(attempts_1)s::INTEGER),
                                                              worker=%(worker)s::VARCHAR,
                                                              finished_at=CASE
                                                                              WHEN (jobs.cancel_requested_at IS NOT NULL) THEN now()
                                                                          END
FROM unnest(%(fence_ids)s::BIGINT[], %(fence_attempts)s::INTEGER[]) AS fence(id, attempt)
WHERE jobs.id = ANY (%(fence_ids)s::BIGINT[])
  AND jobs.id = fence.id
  AND jobs.attempts = fence.attempt
  AND CAST(jobs.status AS TEXT) = 'running'
  AND jobs.worker = %(fence_worker)s::VARCHAR RETURNING jobs.id;
