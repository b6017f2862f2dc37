INSERT INTO jobs (kind, payload, queue, priority, max_attempts, run_at, timeout, status, workflow_id, step, workflow_leaf, meta, tags)
SELECT steps.k,
       steps.p,
       coalesce(steps.q, %(coalesce_2)s::VARCHAR) AS coalesce_1,
       coalesce(steps.pr, %(coalesce_4)s::INTEGER) AS coalesce_3,
       steps.m,
       coalesce(steps.at, statement_timestamp() + interval '1 second' * coalesce(steps.d, %(coalesce_6)s)) AS coalesce_5,
       steps.t,
       CASE
           WHEN steps.w THEN 'waiting'::job_status
           ELSE 'queued'::job_status
       END AS anon_1,
       %(workflow_id)s::UUID AS anon_2,
       steps.s,
       steps.l,
       steps.mt,
       steps.tg
FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS steps(s TEXT, k TEXT, p JSONB, w BOOLEAN, l BOOLEAN, q TEXT, pr SMALLINT, m INTEGER, at TIMESTAMP WITH TIME ZONE, d FLOAT, t FLOAT, mt JSONB, tg TEXT[]) RETURNING jobs.id,
                                                                                                                                                                                                                                jobs.step;
