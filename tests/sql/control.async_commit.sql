SELECT set_config(%(param_1)s::VARCHAR, %(param_2)s::VARCHAR, true) AS set_config_1;
