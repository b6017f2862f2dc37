WITH expired AS MATERIALIZED
  (SELECT jobs.id AS id
   FROM jobs
   WHERE jobs.status = 'running'::job_status
     AND jobs.locked_until < statement_timestamp()
   ORDER BY jobs.locked_until
   LIMIT %(param_1)s::INTEGER
   FOR UPDATE SKIP LOCKED)
UPDATE jobs
SET status=CASE
               WHEN (jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled'::job_status
               WHEN (jobs.attempts >= jobs.max_attempts) THEN 'dead'::job_status
               ELSE 'queued'::job_status
           END,
           run_at=statement_timestamp(),
           locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                              last_error=concat(%(concat_1)s::VARCHAR, jobs.attempts, %(concat_2)s::VARCHAR, jobs.max_attempts, %(concat_3)s::VARCHAR, coalesce(jobs.worker, %(coalesce_1)s::VARCHAR), %(concat_4)s::VARCHAR),
                                                              finished_at=CASE
                                                                              WHEN (jobs.cancel_requested_at IS NOT NULL
                                                                                    OR jobs.attempts >= jobs.max_attempts) THEN statement_timestamp()
                                                                          END,
                                                                          errors=jsonb_path_query_array(coalesce(jobs.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('attempt', jobs.attempts, 'worker', jobs.worker, 'claimed_at', jobs.attempted_at, 'at', statement_timestamp(), 'outcome', 'lease expired', 'then', CAST(CASE
                                                                                                                                                                                                                                                                                                                                               WHEN (jobs.cancel_requested_at IS NOT NULL) THEN 'cancelled'::job_status
                                                                                                                                                                                                                                                                                                                                               WHEN (jobs.attempts >= jobs.max_attempts) THEN 'dead'::job_status
                                                                                                                                                                                                                                                                                                                                               ELSE 'queued'::job_status
                                                                                                                                                                                                                                                                                                                                           END AS TEXT), 'error', CASE
                                                                                                                                                                                                                                                                                                                                                                      WHEN (char_length(concat(%(concat_1)s::VARCHAR, jobs.attempts, %(concat_2)s::VARCHAR, jobs.max_attempts, %(concat_3)s::VARCHAR, coalesce(jobs.worker, %(coalesce_1)s::VARCHAR), %(concat_4)s::VARCHAR)) <= 2000) THEN concat(%(concat_1)s::VARCHAR, jobs.attempts, %(concat_2)s::VARCHAR, jobs.max_attempts, %(concat_3)s::VARCHAR, coalesce(jobs.worker, %(coalesce_1)s::VARCHAR), %(concat_4)s::VARCHAR)
                                                                                                                                                                                                                                                                                                                                                                      ELSE concat(left(concat(%(concat_1)s::VARCHAR, jobs.attempts, %(concat_2)s::VARCHAR, jobs.max_attempts, %(concat_3)s::VARCHAR, coalesce(jobs.worker, %(coalesce_1)s::VARCHAR), %(concat_4)s::VARCHAR), 1999), '…')
                                                                                                                                                                                                                                                                                                                                                                  END)), '$[last - 49 to last]'::jsonpath)
WHERE jobs.id = ANY (CAST(
                            (SELECT array_agg(expired.id) AS array_agg_1
                             FROM expired) AS BIGINT[])) RETURNING jobs.id,
                                                                   jobs.kind,
                                                                   jobs.status,
                                                                   jobs.attempts,
                                                                   jobs.worker;
