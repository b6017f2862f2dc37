SELECT jobs_controls.scope,
       jobs_controls.name,
       jobs_controls.paused,
       coalesce(jobs_controls.concurrency, jobs_controls.declared_concurrency) AS concurrency,
       coalesce(jobs_controls.rate_count, jobs_controls.declared_rate_count) AS rate_count,
       coalesce(jobs_controls.rate_seconds, jobs_controls.declared_rate_seconds) AS rate_seconds,
       jobs_controls.concurrency AS concurrency_override,
       jobs_controls.declared_concurrency,
       jobs_controls.rate_count AS rate_count_override,
       jobs_controls.rate_seconds AS rate_seconds_override,
       jobs_controls.declared_rate_count,
       jobs_controls.declared_rate_seconds,
       jobs_controls.updated_at
FROM jobs_controls
WHERE jobs_controls.paused
  OR coalesce(jobs_controls.concurrency, jobs_controls.declared_concurrency) IS NOT NULL
  OR coalesce(jobs_controls.rate_count, jobs_controls.declared_rate_count) IS NOT NULL
ORDER BY jobs_controls.scope,
         jobs_controls.name;
