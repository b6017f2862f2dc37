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
           run_at=(statement_timestamp() + interval '1 second' * %(delay)s),
           locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                              attempts=CASE
                                                                           WHEN (jobs.cancel_requested_at IS NOT NULL) THEN jobs.attempts
                                                                           ELSE jobs.attempts - %(attempts_1)s::INTEGER
                                                                       END,
                                                                       worker=CASE
                                                                                  WHEN (jobs.cancel_requested_at IS NOT NULL) THEN jobs.worker
                                                                              END,
                                                                              last_error=%(error)s::VARCHAR,
                                                                              finished_at=CASE
                                                                                              WHEN (jobs.cancel_requested_at IS NOT NULL) THEN statement_timestamp()
                                                                                          END,
                                                                                          snoozes=(jobs.snoozes + %(snoozes_1)s::INTEGER),
                                                                                          errors=jsonb_path_query_array(coalesce(jobs.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('attempt', jobs.attempts, 'worker', jobs.worker, 'claimed_at', jobs.attempted_at, 'at', statement_timestamp(), 'outcome', 'snoozed', 'then', CAST(CASE
                                                                                                                                                                                                                                                                                                                                                         WHEN (jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled'::job_status
                                                                                                                                                                                                                                                                                                                                                         ELSE 'queued'::job_status
                                                                                                                                                                                                                                                                                                                                                     END AS TEXT), 'error', CASE
                                                                                                                                                                                                                                                                                                                                                                                WHEN (char_length(%(error)s::VARCHAR) <= 2000) THEN %(error)s::VARCHAR
                                                                                                                                                                                                                                                                                                                                                                                ELSE concat(left(%(error)s::VARCHAR, 1999), '…')
                                                                                                                                                                                                                                                                                                                                                                            END)), '$[last - 49 to last]'::jsonpath)
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
