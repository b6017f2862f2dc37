WITH stuck AS MATERIALIZED
  (SELECT DISTINCT jobs_workflow_edges.parent_id AS parent_id
   FROM jobs_workflow_edges
   JOIN jobs AS child ON child.id = jobs_workflow_edges.child_id
   LEFT OUTER JOIN jobs AS parent ON parent.id = jobs_workflow_edges.parent_id
   WHERE jobs_workflow_edges.parent_outcome IS NULL
     AND (parent.id IS NULL
          OR parent.status IN ('done'::job_status,
                               'dead'::job_status,
                               'cancelled'::job_status))
     AND child.status = 'waiting'::job_status
   LIMIT %(limit)s::INTEGER)
SELECT jobs_workflow_resolve(coalesce(array_agg(stuck.parent_id), CAST(%(param_1)s::VARCHAR AS BIGINT[]))) AS jobs_workflow_resolve_1
FROM stuck;
