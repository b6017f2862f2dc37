SELECT anon_1.name,
       CAST(sum(pg_stat_user_tables.n_live_tup) AS BIGINT) AS live_tuples,
       CAST(sum(pg_stat_user_tables.n_dead_tup) AS BIGINT) AS dead_tuples,
       CAST(sum(pg_stat_user_tables.n_tup_upd) AS BIGINT) AS updates,
       CAST(sum(pg_stat_user_tables.n_tup_hot_upd) AS BIGINT) AS hot_updates,
       coalesce(min(pg_stat_user_tables.last_vacuum) FILTER (
                                                             WHERE pg_stat_user_tables.n_dead_tup > %(n_dead_tup_1)s::BIGINT), max(pg_stat_user_tables.last_vacuum)) AS last_vacuum,
       coalesce(min(pg_stat_user_tables.last_autovacuum) FILTER (
                                                                 WHERE pg_stat_user_tables.n_dead_tup > %(n_dead_tup_2)s::BIGINT), max(pg_stat_user_tables.last_autovacuum)) AS last_autovacuum,
       coalesce(min(pg_stat_user_tables.last_analyze) FILTER (
                                                              WHERE pg_stat_user_tables.n_dead_tup > %(n_dead_tup_3)s::BIGINT), max(pg_stat_user_tables.last_analyze)) AS last_analyze,
       coalesce(min(pg_stat_user_tables.last_autoanalyze) FILTER (
                                                                  WHERE pg_stat_user_tables.n_dead_tup > %(n_dead_tup_4)s::BIGINT), max(pg_stat_user_tables.last_autoanalyze)) AS last_autoanalyze,
       CAST(sum(pg_table_size(pg_stat_user_tables.relid)) AS BIGINT) AS table_bytes,
       CAST(sum(pg_indexes_size(pg_stat_user_tables.relid)) AS BIGINT) AS index_bytes,
       current_setting(%(current_setting_1)s::VARCHAR) = %(current_setting_2)s::VARCHAR AS server_autovacuum,
       NOT coalesce(bool_or(array_to_string(pg_class.reloptions, %(array_to_string_1)s::VARCHAR) ~* %(array_to_string_2)s::VARCHAR), %(coalesce_1)s) AS table_autovacuum
FROM unnest(%(param_1)s::TEXT[]) AS anon_1
LEFT OUTER JOIN LATERAL pg_partition_tree(to_regclass(quote_ident(current_schema()) || %(quote_ident_1)s::VARCHAR || anon_1.name)) AS tree ON tree.isleaf
JOIN pg_stat_user_tables ON pg_stat_user_tables.relid = coalesce(tree.relid, to_regclass(quote_ident(current_schema()) || %(quote_ident_1)s::VARCHAR || anon_1.name))
JOIN pg_class ON pg_class.oid = pg_stat_user_tables.relid
GROUP BY anon_1.name
ORDER BY anon_1.name;
