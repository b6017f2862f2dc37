SELECT jobs_periodic.name,
       jobs_periodic.last_tick,
       now() AS now
FROM jobs_periodic
WHERE jobs_periodic.name = any(%(names)s::TEXT[])
  FOR
  UPDATE SKIP LOCKED;
