SELECT pg_try_advisory_lock(%(key)s::BIGINT) AS pg_try_advisory_lock_1;
