WITH fence AS MATERIALIZED
  (SELECT array_agg(lease.id
                    ORDER BY lease.id, lease.attempt) AS ids,
          array_agg(lease.attempt
                    ORDER BY lease.id, lease.attempt) AS attempts
   FROM unnest(%(fence_ids)s::BIGINT[], %(fence_attempts)s::INTEGER[]) AS lease(id, attempt))
UPDATE jobs
SET status=CASE
               WHEN (jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled'::job_status
               ELSE 'queued'::job_status
           END,
           locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                              attempts=(jobs.attempts - %(attempts_1)s::INTEGER),
                                                              worker=%(worker)s::VARCHAR,
                                                              finished_at=CASE
                                                                              WHEN (jobs.cancel_requested_at IS NOT NULL) THEN statement_timestamp()
                                                                          END,
                                                                          attempted_at=%(attempted_at)s::TIMESTAMP WITH TIME ZONE
WHERE jobs.id = ANY (%(fence_ids)s::BIGINT[])
  AND jobs.attempts = ANY (
                             (SELECT fence.attempts
                              FROM fence)[width_bucket(jobs.id - 1,
                                                         (SELECT fence.ids
                                                          FROM fence)) + 1:width_bucket(jobs.id,
                                                                                          (SELECT fence.ids
                                                                                           FROM fence))])
  AND CAST(jobs.status AS TEXT) = 'running'
  AND jobs.worker = %(fence_worker)s::VARCHAR RETURNING jobs.id;
