SELECT pg_try_advisory_xact_lock(%(key)s::BIGINT) AS pg_try_advisory_xact_lock_1;
