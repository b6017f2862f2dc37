SELECT set_config('statement_timeout', CAST(%(ms)s::INTEGER AS TEXT), true) AS set_config_1;
