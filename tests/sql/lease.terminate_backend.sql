SELECT pg_terminate_backend(%(pid)s::INTEGER) AS pg_terminate_backend_1;
