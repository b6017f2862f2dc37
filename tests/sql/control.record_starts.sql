INSERT INTO jobs_rate_starts (scope, name, started_at, count)
VALUES (%(scope)s::VARCHAR, %(name)s::VARCHAR, clock_timestamp(), %(count)s::INTEGER) RETURNING jobs_rate_starts.id;
