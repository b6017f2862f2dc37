SELECT jobs.workflow_id
FROM jobs
WHERE jobs.id = %(job_id)s::BIGINT;
