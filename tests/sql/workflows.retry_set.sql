WITH RECURSIVE picked(id) AS
  (SELECT jobs.id AS id
   FROM jobs
   WHERE jobs.workflow_id = %(workflow_id)s::UUID
     AND jobs.status IN ('dead'::job_status,
                         'cancelled'::job_status)
   UNION SELECT jobs_workflow_edges.child_id AS child_id
   FROM jobs_workflow_edges
   JOIN picked ON jobs_workflow_edges.parent_id = picked.id)
SELECT jobs.id
FROM jobs
WHERE jobs.id IN
    (SELECT picked.id
     FROM picked)
  AND jobs.status IN ('done'::job_status,
                      'dead'::job_status,
                      'cancelled'::job_status)
ORDER BY jobs.id;
