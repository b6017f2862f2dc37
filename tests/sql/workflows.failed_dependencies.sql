SELECT jobs_workflow_edges.child_id,
       child.step AS child_step,
       child.workflow_id,
       jobs_workflow_edges.parent_id,
       coalesce(parent.step, jobs_archive.step) AS parent_step,
       jobs_workflow_edges.parent_outcome AS outcome
FROM jobs_workflow_edges
JOIN jobs AS child ON child.id = jobs_workflow_edges.child_id
LEFT OUTER JOIN jobs AS parent ON parent.id = jobs_workflow_edges.parent_id
LEFT OUTER JOIN jobs_archive ON jobs_archive.id = jobs_workflow_edges.parent_id
WHERE jobs_workflow_edges.child_id = ANY (%(ids)s::BIGINT[])
  AND jobs_workflow_edges.requires = %(requires_1)s::VARCHAR
  AND jobs_workflow_edges.parent_outcome IS NOT NULL
  AND jobs_workflow_edges.parent_outcome != %(parent_outcome_1)s::VARCHAR
  AND jobs_workflow_edges.parent_id != ALL (%(ids)s::BIGINT[])
ORDER BY jobs_workflow_edges.child_id,
         jobs_workflow_edges.parent_id;
