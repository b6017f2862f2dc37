INSERT INTO jobs_workers (id, host, pid, version, queues, kinds, concurrency, started_at, heartbeat_at, expires_at, running)
VALUES (%(worker)s::VARCHAR, %(host)s::VARCHAR, %(pid)s::INTEGER, %(version)s::VARCHAR, %(queues)s::TEXT[], %(kinds)s::TEXT[], %(concurrency)s::INTEGER, statement_timestamp(), statement_timestamp(), (statement_timestamp() + interval '1 second' * %(lock_seconds)s), %(running)s::INTEGER) ON CONFLICT (id) DO
UPDATE
SET heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at,
    running = excluded.running;
