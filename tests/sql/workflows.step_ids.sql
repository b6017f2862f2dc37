SELECT jobs.step,
       jobs.id
FROM jobs
WHERE jobs.workflow_id = %(workflow_id)s::UUID
UNION ALL
SELECT jobs_archive.step,
       jobs_archive.id
FROM jobs_archive
WHERE jobs_archive.workflow_id = %(workflow_id)s::UUID;
