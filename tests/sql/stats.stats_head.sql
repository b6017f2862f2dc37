SELECT clock.taken_at,
       table_stats.reltuples,
       table_stats.n_live_tup,
       table_stats.n_dead_tup,
       table_stats.last_vacuum,
       table_stats.last_autovacuum,
       table_stats.last_autoanalyze,
       status_estimates.vals,
       status_estimates.freqs
FROM
  (SELECT statement_timestamp() AS taken_at) AS clock
LEFT OUTER JOIN
  (SELECT pg_class.reltuples AS reltuples,
          pg_stat_user_tables.n_live_tup AS n_live_tup,
          pg_stat_user_tables.n_dead_tup AS n_dead_tup,
          pg_stat_user_tables.last_vacuum AS last_vacuum,
          pg_stat_user_tables.last_autovacuum AS last_autovacuum,
          pg_stat_user_tables.last_autoanalyze AS last_autoanalyze
   FROM pg_class
   JOIN pg_stat_user_tables ON pg_stat_user_tables.relid = pg_class.oid
   WHERE pg_class.oid = CAST(%(param_1)s::VARCHAR AS REGCLASS)) AS table_stats ON true
LEFT OUTER JOIN
  (SELECT CAST(CAST(pg_stats.most_common_vals AS TEXT) AS TEXT[]) AS vals,
          pg_stats.most_common_freqs AS freqs
   FROM pg_stats
   WHERE pg_stats.schemaname = current_schema()
     AND pg_stats.tablename = %(tablename_1)s::VARCHAR
     AND pg_stats.attname = %(attname_1)s::VARCHAR) AS status_estimates ON true;
