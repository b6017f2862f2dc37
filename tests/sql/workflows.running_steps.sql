SELECT jobs.id
FROM jobs
WHERE jobs.workflow_id = %(workflow_id)s::UUID
  AND jobs.status = 'running'::job_status;
