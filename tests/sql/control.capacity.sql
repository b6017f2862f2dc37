SELECT jobs_controls.scope,
       jobs_controls.name,
       jobs_controls.paused,
       coalesce(jobs_controls.concurrency, jobs_controls.declared_concurrency) AS concurrency,

  (SELECT count(*) AS count_1
   FROM jobs
   WHERE jobs.status = 'running'::job_status
     AND jobs.worker IS DISTINCT
     FROM %(worker)s::VARCHAR
     AND (jobs_controls.scope = %(scope_1)s::VARCHAR
          AND jobs.kind = jobs_controls.name
          OR jobs_controls.scope = %(scope_2)s::VARCHAR
          AND jobs.queue = jobs_controls.name)) AS running,
       coalesce(jobs_controls.rate_count, jobs_controls.declared_rate_count) AS rate_count,
       coalesce(jobs_controls.rate_seconds, jobs_controls.declared_rate_seconds) AS rate_seconds,

  (SELECT coalesce(sum(jobs_rate_starts.count), %(coalesce_2)s::INTEGER) AS coalesce_1
   FROM jobs_rate_starts
   WHERE jobs_rate_starts.scope = jobs_controls.scope
     AND jobs_rate_starts.name = jobs_controls.name
     AND jobs_rate_starts.started_at > clock_timestamp() - interval '1 second' * (coalesce(jobs_controls.rate_seconds, jobs_controls.declared_rate_seconds) + least(coalesce(jobs_controls.rate_seconds, jobs_controls.declared_rate_seconds) / CAST(%(coalesce_3)s::INTEGER AS NUMERIC), %(margin)s))) AS started,
       EXTRACT(epoch
               FROM
                 (SELECT min(jobs_rate_starts.started_at) AS min_1
                  FROM jobs_rate_starts
                  WHERE jobs_rate_starts.scope = jobs_controls.scope
                    AND jobs_rate_starts.name = jobs_controls.name
                    AND jobs_rate_starts.started_at > clock_timestamp() - interval '1 second' * (coalesce(jobs_controls.rate_seconds, jobs_controls.declared_rate_seconds) + least(coalesce(jobs_controls.rate_seconds, jobs_controls.declared_rate_seconds) / CAST(%(coalesce_3)s::INTEGER AS NUMERIC), %(margin)s))) - (clock_timestamp() - interval '1 second' * (coalesce(jobs_controls.rate_seconds, jobs_controls.declared_rate_seconds) + least(coalesce(jobs_controls.rate_seconds, jobs_controls.declared_rate_seconds) / CAST(%(coalesce_3)s::INTEGER AS NUMERIC), %(margin)s)))) AS next_start_in
FROM jobs_controls
WHERE (jobs_controls.scope,
       jobs_controls.name) IN ((%(param_1)s::VARCHAR,
                                %(param_2)s::VARCHAR), (%(param_3)s::VARCHAR,
                                                        %(param_4)s::VARCHAR));
