UPDATE jobs
SET status='waiting'::job_status
WHERE jobs.id = ANY (%(ids)s::BIGINT[])
  AND jobs.status = 'queued'::job_status
  AND (EXISTS
         (SELECT *
          FROM jobs_workflow_edges
          WHERE jobs_workflow_edges.child_id = jobs.id
            AND jobs_workflow_edges.parent_outcome IS NULL)) RETURNING jobs.id;
