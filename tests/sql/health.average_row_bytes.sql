SELECT sum(pg_stats.avg_width) + %(sum_1)s::BIGINT AS anon_1
FROM pg_stats
WHERE pg_stats.schemaname = current_schema()
  AND pg_stats.tablename = %(table)s::VARCHAR;
