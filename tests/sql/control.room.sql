SELECT
  (SELECT greatest(%(greatest_2)s::INTEGER, least(%(limit)s::INTEGER, min(CASE
                                                                              WHEN per_scope.paused THEN %(param_1)s::INTEGER
                                                                              WHEN (per_scope.rate_count IS NOT NULL) THEN %(param_2)s::INTEGER
                                                                              ELSE ((per_scope.concurrency - per_scope.running) - CASE
                                                                                                                                      WHEN (per_scope.scope = %(scope_1)s::VARCHAR) THEN %(mine_kind)s::INTEGER
                                                                                                                                      ELSE %(mine_queue)s::INTEGER
                                                                                                                                  END) + CASE
                                                                                                                                             WHEN (per_scope.running < per_scope.concurrency) THEN %(reserve)s::INTEGER
                                                                                                                                             ELSE %(param_3)s::INTEGER
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
             jobs_controls.name) IN ((%(param_4)s::VARCHAR,
                                      %(param_5)s::VARCHAR), (%(param_6)s::VARCHAR,
                                                              %(param_7)s::VARCHAR))) AS per_scope) AS anon_1;
