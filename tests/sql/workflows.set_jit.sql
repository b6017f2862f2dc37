SELECT current_setting('jit') AS
before,
       set_config('jit', %(jit)s::VARCHAR, true) AS now;
