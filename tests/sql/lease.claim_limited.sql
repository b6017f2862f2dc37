WITH picked AS MATERIALIZED
  (SELECT ready.id AS id
   FROM generate_series(0, 9) AS levels(level)
   JOIN LATERAL
     (SELECT jobs.id AS id
      FROM jobs
      WHERE jobs.status = 'queued'::job_status
        AND jobs.priority = levels.level
        AND jobs.run_at >= coalesce((CAST(%(floors)s::TIMESTAMP WITH TIME ZONE[] AS TIMESTAMP WITH TIME ZONE[]))[(levels.level + 1)], '-infinity'::timestamptz)
        AND jobs.run_at <= statement_timestamp()
        AND jobs.queue = ANY (array(
                                      (SELECT unnest(%(queues)s::TEXT[]) AS name
                                       EXCEPT SELECT jobs_controls.name
                                       FROM jobs_controls
                                       WHERE jobs_controls.scope = %(param_1)s::VARCHAR
                                         AND (jobs_controls.paused
                                              OR (coalesce(jobs_controls.concurrency, jobs_controls.declared_concurrency) IS NOT NULL
                                                  OR coalesce(jobs_controls.rate_count, jobs_controls.declared_rate_count) IS NOT NULL)
                                              AND jobs_controls.name != ALL (%(locked_queues)s::TEXT[])))))
        AND jobs.kind = ANY (array(
                                     (SELECT unnest(%(kinds)s::TEXT[]) AS name
                                      EXCEPT SELECT jobs_controls.name
                                      FROM jobs_controls
                                      WHERE jobs_controls.scope = %(param_2)s::VARCHAR
                                        AND (jobs_controls.paused
                                             OR (coalesce(jobs_controls.concurrency, jobs_controls.declared_concurrency) IS NOT NULL
                                                 OR coalesce(jobs_controls.rate_count, jobs_controls.declared_rate_count) IS NOT NULL)
                                             AND jobs_controls.name != ALL (%(locked_kinds)s::TEXT[])))))
      ORDER BY jobs.run_at
      LIMIT %(limit)s::INTEGER
      FOR UPDATE SKIP LOCKED) AS ready ON true
   WHERE levels.level <= %(max_priority)s::INTEGER
   LIMIT %(limit)s::INTEGER), claimed AS
  (UPDATE jobs
   SET status='running'::job_status,
       locked_until=(statement_timestamp() + interval '1 second' * %(lock_seconds)s),
       attempts=(jobs.attempts + %(attempts_1)s::INTEGER),
       max_attempts=coalesce(jobs.max_attempts, CAST(
                                                       (SELECT CAST(%(handler_max_attempts)s::VARCHAR AS JSONB) AS anon_1) ->> jobs.kind AS INTEGER), 8),
       worker=%(worker)s::VARCHAR,
       attempted_at=statement_timestamp()
   WHERE jobs.id = ANY (CAST(
                               (SELECT array_agg(picked.id) AS array_agg_1
                                FROM picked) AS BIGINT[])) RETURNING jobs.id,
                                                                     jobs.kind,
                                                                     jobs.queue,
                                                                     jobs.payload,
                                                                     jobs.attempts,
                                                                     jobs.max_attempts,
                                                                     jobs.timeout,
                                                                     jobs.snoozes,
                                                                     jobs.priority,
                                                                     jobs.meta,
                                                                     jobs.tags,
                                                                     jobs.run_at,
                                                                     CAST(EXTRACT(epoch
                                                                                  FROM statement_timestamp() - jobs.run_at) AS FLOAT) AS waited)
SELECT claimed.id,
       claimed.kind,
       claimed.queue,
       claimed.payload,
       claimed.attempts,
       claimed.max_attempts,
       claimed.timeout,
       claimed.snoozes,
       claimed.priority,
       claimed.meta,
       claimed.tags,
       claimed.waited,
       claimed.run_at
FROM claimed
WHERE
    (SELECT set_config('synchronous_commit', 'off', true) AS set_config_1) IS NOT NULL
ORDER BY claimed.priority,
         claimed.run_at,
         claimed.id;
