SELECT pg_stat_activity.pid,
       pg_stat_activity.usename AS "user",
       pg_stat_activity.application_name,
       pg_stat_activity.backend_type,
       pg_stat_activity.state,
       pg_stat_activity.xact_start,
       pg_stat_activity.query_start,
       EXTRACT(epoch
               FROM statement_timestamp() - pg_stat_activity.xact_start) AS age_seconds,
       greatest(age(pg_stat_activity.backend_xmin), age(pg_stat_activity.backend_xid)) AS xid_age,
       left(pg_stat_activity.query, %(left_1)s::INTEGER) AS query
FROM pg_stat_activity
WHERE pg_stat_activity.datname = current_database()
  AND pg_stat_activity.pid != pg_backend_pid()
  AND (pg_stat_activity.backend_xmin IS NOT NULL
       OR pg_stat_activity.backend_xid IS NOT NULL)
ORDER BY greatest(age(pg_stat_activity.backend_xmin), age(pg_stat_activity.backend_xid)) DESC, pg_stat_activity.xact_start
LIMIT %(param_1)s::INTEGER;
