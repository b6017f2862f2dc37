SELECT pg_advisory_lock_shared(%(key)s::BIGINT) AS pg_advisory_lock_shared_1;
