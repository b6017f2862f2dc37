WITH fence AS MATERIALIZED
  (SELECT array_agg(lease.id
                    ORDER BY lease.id, lease.attempt) AS ids,
          array_agg(lease.attempt
                    ORDER BY lease.id, lease.attempt) AS attempts
   FROM unnest(%(fence_ids)s::BIGINT[], %(fence_attempts)s::INTEGER[]) AS lease(id, attempt))
UPDATE jobs
SET status='cancelled'::job_status,
    locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                       last_error=%(error)s::VARCHAR,
                                                       finished_at=statement_timestamp()
WHERE jobs.id = ANY (%(fence_ids)s::BIGINT[])
  AND jobs.attempts = ANY (
                             (SELECT fence.attempts
                              FROM fence)[width_bucket(jobs.id - 1,
                                                         (SELECT fence.ids
                                                          FROM fence)) + 1:width_bucket(jobs.id,
                                                                                          (SELECT fence.ids
                                                                                           FROM fence))])
  AND CAST(jobs.status AS TEXT) = 'running'
  AND jobs.worker = %(fence_worker)s::VARCHAR RETURNING jobs.id,
                                                        jobs.status;
