SELECT jobs.id
FROM jobs
WHERE jobs.workflow_id IS NOT NULL
  AND (EXISTS
         (SELECT *
          FROM jobs AS step
          WHERE step.workflow_id = jobs.workflow_id
            AND step.status IN ('waiting'::job_status,
                                'queued'::job_status,
                                'running'::job_status)));
