INSERT INTO jobs_controls (scope, name, declared_concurrency, declared_rate_count, declared_rate_seconds)
VALUES (%(scope_m0)s::VARCHAR, %(name_m0)s::VARCHAR, %(declared_concurrency_m0)s::INTEGER, %(declared_rate_count_m0)s::INTEGER, %(declared_rate_seconds_m0)s) ON CONFLICT (scope, name) DO
UPDATE
SET declared_concurrency = excluded.declared_concurrency,
    declared_rate_count = excluded.declared_rate_count,
    declared_rate_seconds = excluded.declared_rate_seconds
WHERE jobs_controls.declared_concurrency IS DISTINCT
  FROM excluded.declared_concurrency
  OR jobs_controls.declared_rate_count IS DISTINCT
  FROM excluded.declared_rate_count
  OR jobs_controls.declared_rate_seconds IS DISTINCT
  FROM excluded.declared_rate_seconds;
