INSERT INTO jobs (kind, payload, idempotency_key)
VALUES (%(kind)s::VARCHAR, CAST(%(payload)s::VARCHAR AS JSONB), %(idempotency_key)s::VARCHAR) ON CONFLICT (idempotency_key) DO NOTHING RETURNING jobs.id,
                                                                                                                                                 jobs.queue,
                                                                                                                                                 jobs.priority,
                                                                                                                                                 jobs.status,
                                                                                                                                                 jobs.run_at,
                                                                                                                                                 jobs.attempts,
                                                                                                                                                 jobs.created_at,
                                                                                                                                                 jobs.snoozes;
