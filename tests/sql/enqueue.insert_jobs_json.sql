INSERT INTO jobs (kind, payload, queue, priority, max_attempts, idempotency_key, run_at, timeout, meta, tags)
SELECT new_jobs.k,
       new_jobs.p,
       coalesce(new_jobs.q, %(coalesce_2)s::VARCHAR) AS coalesce_1,
       coalesce(new_jobs.pr, %(coalesce_4)s::INTEGER) AS coalesce_3,
       new_jobs.m,
       new_jobs.key,
       coalesce(new_jobs.at, statement_timestamp() + interval '1 second' * coalesce(new_jobs.d, %(coalesce_6)s)) AS coalesce_5,
       new_jobs.t,
       new_jobs.mt,
       new_jobs.tg
FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS new_jobs(k TEXT, p JSONB, q TEXT, pr SMALLINT, m INTEGER, key TEXT, at TIMESTAMP WITH TIME ZONE, d FLOAT, t FLOAT, mt JSONB, tg TEXT[]) ON CONFLICT (idempotency_key) DO NOTHING RETURNING jobs.id;
