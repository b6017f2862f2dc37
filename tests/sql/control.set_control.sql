INSERT INTO jobs_controls (scope, name, paused)
VALUES (%(scope)s::VARCHAR, %(name)s::VARCHAR, %(paused)s) ON CONFLICT (scope, name) DO
UPDATE
SET paused = excluded.paused,
    updated_at = statement_timestamp()
WHERE jobs_controls.paused IS DISTINCT
  FROM excluded.paused RETURNING jobs_controls.scope;
