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
   LIMIT
     (SELECT greatest(%(greatest_2)s::INTEGER, least(%(limit)s::INTEGER, min(CASE
                                                                                 WHEN per_scope.paused THEN %(param_3)s::INTEGER
                                                                                 WHEN (per_scope.rate_count IS NOT NULL) THEN %(param_4)s::INTEGER
                                                                                 ELSE ((per_scope.concurrency - per_scope.running) - CASE
                                                                                                                                         WHEN (per_scope.scope = %(scope_1)s::VARCHAR) THEN %(mine_kind)s::INTEGER
                                                                                                                                         ELSE %(mine_queue)s::INTEGER
                                                                                                                                     END) + CASE
                                                                                                                                                WHEN (per_scope.running < per_scope.concurrency) THEN %(reserve)s::INTEGER
                                                                                                                                                ELSE %(param_5)s::INTEGER
                                                                                                                                            END
                                                                             END))) AS greatest_1
      FROM
        (SELECT jobs_controls.scope AS scope,
                jobs_controls.paused AS paused,
                coalesce(jobs_controls.rate_count, jobs_controls.declared_rate_count) AS rate_count,
                coalesce(jobs_controls.concurrency, jobs_controls.declared_concurrency) AS concurrency,

           (SELECT count(*) AS count_1
            FROM jobs
            WHERE jobs.status = 'running'::job_status
              AND jobs.worker IS DISTINCT
              FROM %(worker)s::VARCHAR
              AND (jobs_controls.scope = %(scope_2)s::VARCHAR
                   AND jobs.kind = jobs_controls.name
                   OR jobs_controls.scope = %(scope_3)s::VARCHAR
                   AND jobs.queue = jobs_controls.name)) AS running
         FROM jobs_controls
         WHERE (jobs_controls.scope,
                jobs_controls.name) IN ((%(param_6)s::VARCHAR,
                                         %(param_7)s::VARCHAR))) AS per_scope)), claimed AS
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
