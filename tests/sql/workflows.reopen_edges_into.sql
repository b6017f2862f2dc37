UPDATE jobs_workflow_edges
SET parent_outcome=%(parent_outcome)s::VARCHAR
WHERE jobs_workflow_edges.parent_id = ANY (%(parents)s::BIGINT[])
  AND jobs_workflow_edges.child_id = ANY (%(children)s::BIGINT[]);
