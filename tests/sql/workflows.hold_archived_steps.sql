SELECT jobs_archive.id
FROM jobs_archive
WHERE jobs_archive.workflow_id = %(workflow_id)s::UUID
LIMIT %(param_1)s::INTEGER
FOR KEY SHARE;
