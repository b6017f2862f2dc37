INSERT INTO jobs_periodic (name, kind, expression, last_tick)
SELECT declared.name,
       declared.kind,
       declared.expression,
       statement_timestamp() AS statement_timestamp_1
FROM unnest(%(names)s::TEXT[], %(kinds)s::TEXT[], %(expressions)s::TEXT[]) AS declared(name, kind, expression) ON CONFLICT (name) DO NOTHING;
