SELECT jobs.id
FROM jobs
WHERE jobs.workflow_id = %(workflow_id)s::UUID
LIMIT %(param_1)s::INTEGER
FOR KEY SHARE;
