SELECT set_config('enable_seqscan', 'off', true) AS set_config_1;
