SELECT jobs.id
FROM jobs
WHERE jobs.workflow_id IS NOT NULL
  AND
    (SELECT 1
     FROM jobs AS other_step
     WHERE other_step.workflow_id = jobs.workflow_id
       AND other_step.status IN ('waiting'::job_status,
                                 'queued'::job_status,
                                 'running'::job_status)
     LIMIT %(param_1)s::INTEGER) IS NOT NULL;
