SELECT pg_advisory_xact_lock(%(key)s::BIGINT) AS pg_advisory_xact_lock_1;
