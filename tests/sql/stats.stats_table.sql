SELECT pg_class.reltuples,
       pg_stat_user_tables.n_live_tup,
       pg_stat_user_tables.n_dead_tup,
       pg_stat_user_tables.last_vacuum,
       pg_stat_user_tables.last_autovacuum,
       pg_stat_user_tables.last_autoanalyze
FROM pg_class
JOIN pg_stat_user_tables ON pg_stat_user_tables.relid = pg_class.oid
WHERE pg_class.oid = CAST(%(param_1)s::VARCHAR AS REGCLASS);
