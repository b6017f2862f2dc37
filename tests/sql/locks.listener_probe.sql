SELECT pg_notify(%(pg_notify_1)s::VARCHAR, %(pg_notify_2)s::VARCHAR) AS sent,
       pg_is_in_recovery()
OR current_setting(%(current_setting_1)s::VARCHAR) = %(current_setting_2)s::VARCHAR AS not_a_primary;
