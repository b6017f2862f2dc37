SELECT jobs_archive.id
FROM jobs_archive
WHERE
    (SELECT 1
     FROM jobs AS other_step
     WHERE other_step.workflow_id = jobs_archive.workflow_id
     LIMIT %(param_1)s::INTEGER) IS NOT NULL;
