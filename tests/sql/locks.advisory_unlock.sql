SELECT pg_advisory_unlock(%(key)s::BIGINT) AS pg_advisory_unlock_1;
