SELECT jobs.id,
       jobs.status,
       jobs.queue,
       jobs.kind
FROM jobs
WHERE jobs.status IN ('done'::job_status)
  AND jobs.queue = %(queue)s::VARCHAR
ORDER BY jobs.id;
