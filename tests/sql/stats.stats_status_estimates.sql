SELECT CAST(CAST(pg_stats.most_common_vals AS TEXT) AS TEXT[]) AS vals,
       pg_stats.most_common_freqs AS freqs
FROM pg_stats
WHERE pg_stats.schemaname = current_schema()
  AND pg_stats.tablename = %(tablename_1)s::VARCHAR
  AND pg_stats.attname = %(attname_1)s::VARCHAR;
