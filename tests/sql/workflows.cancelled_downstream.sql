WITH RECURSIVE found(id) AS
  (SELECT jobs_workflow_edges.child_id AS id
   FROM jobs_workflow_edges
   JOIN jobs AS child ON child.id = jobs_workflow_edges.child_id
   WHERE jobs_workflow_edges.parent_id = ANY (%(ids)s::BIGINT[])
     AND child.status = 'cancelled'::job_status
     AND (child.last_error LIKE %(last_error_1)s::VARCHAR || '%%' ESCAPE '/')
   UNION SELECT jobs_workflow_edges.child_id AS id
   FROM jobs_workflow_edges
   JOIN jobs AS child ON child.id = jobs_workflow_edges.child_id,
                         found
   WHERE jobs_workflow_edges.parent_id = found.id
     AND child.status = 'cancelled'::job_status
     AND (child.last_error LIKE %(last_error_2)s::VARCHAR || '%%' ESCAPE '/'))
SELECT found.id
FROM found
ORDER BY found.id;
