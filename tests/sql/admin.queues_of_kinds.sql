SELECT DISTINCT jobs.queue
FROM jobs
WHERE jobs.kind = ANY (%(param_1)s::TEXT[])
  AND jobs.status IN ('queued'::job_status,
                      'running'::job_status);
