INSERT INTO jobs (kind, queue, payload, run_at, idempotency_key)
VALUES (%(kind)s::VARCHAR, %(queue)s::VARCHAR, CAST(%(payload)s::VARCHAR AS JSONB), (statement_timestamp() + interval '1 second' * %(delay)s), %(idempotency_key)s::VARCHAR) ON CONFLICT (idempotency_key) DO NOTHING RETURNING jobs.id;
