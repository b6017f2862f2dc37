SELECT jobs_periodic.name,
       jobs_periodic.kind,
       jobs_periodic.expression,
       jobs_periodic.last_tick,
       jobs_periodic.last_job_id,
       CAST(coalesce(live.status, archived.status) AS TEXT) AS last_job_status
FROM jobs_periodic
LEFT OUTER JOIN jobs AS live ON live.id = jobs_periodic.last_job_id
LEFT OUTER JOIN jobs_archive AS archived ON archived.id = jobs_periodic.last_job_id
ORDER BY jobs_periodic.name;
