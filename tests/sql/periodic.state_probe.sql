SELECT jobs_periodic.name,
       jobs_periodic.kind,
       jobs_periodic.expression,
       jobs_periodic.last_tick,
       jobs_periodic.last_job_id,
       jobs_periodic.created_at,
       jobs_periodic.updated_at
FROM jobs_periodic
LIMIT %(param_1)s::INTEGER;
