SELECT pg_stat_user_tables.relname AS name,
       pg_stat_user_tables.n_live_tup AS live_tuples,
       pg_stat_user_tables.n_dead_tup AS dead_tuples,
       pg_stat_user_tables.n_tup_upd AS updates,
       pg_stat_user_tables.n_tup_hot_upd AS hot_updates,
       pg_stat_user_tables.last_vacuum,
       pg_stat_user_tables.last_autovacuum,
       pg_stat_user_tables.last_analyze,
       pg_stat_user_tables.last_autoanalyze,
       pg_table_size(pg_stat_user_tables.relid) AS table_bytes,
       pg_indexes_size(pg_stat_user_tables.relid) AS index_bytes
FROM pg_stat_user_tables
WHERE pg_stat_user_tables.schemaname = current_schema()
  AND pg_stat_user_tables.relname = ANY (%(param_1)s::TEXT[])
ORDER BY pg_stat_user_tables.relname;
