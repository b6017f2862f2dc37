SELECT CURRENT_USER AS role,
                       pg_has_role(CURRENT_USER, %(param_1)s::VARCHAR, %(param_2)s::VARCHAR) AS sees_all,
                       coalesce(
                                  (SELECT coalesce(pg_stat_database.stats_reset, pg_postmaster_start_time()) AS coalesce_1
                                   FROM pg_stat_database
                                   WHERE pg_stat_database.datname = current_database()), pg_postmaster_start_time()) AS stats_since;
