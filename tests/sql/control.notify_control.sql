SELECT pg_notify(%(param_1)s::VARCHAR, %(param_2)s::VARCHAR) AS pg_notify_1;
