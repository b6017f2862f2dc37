SELECT jobs_periodic.name,
       jobs_periodic.last_tick,
       statement_timestamp() AS now
FROM jobs_periodic
WHERE jobs_periodic.name = any(%(names)s::TEXT[])
  FOR
  UPDATE SKIP LOCKED;
