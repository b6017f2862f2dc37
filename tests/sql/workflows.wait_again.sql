UPDATE jobs
SET status='waiting'::job_status
WHERE jobs.id = ANY (%(ids)s::BIGINT[])
  AND jobs.status = 'queued'::job_status
  AND (EXISTS
         (SELECT *
          FROM jobs_workflow_edges
          WHERE jobs_workflow_edges.child_id = jobs.id
            AND jobs_workflow_edges.parent_outcome IS NULL
            AND (jobs_workflow_edges.parent_id = ANY (%(ids)s::BIGINT[])
                 OR (EXISTS
                       (SELECT parent.id
                        FROM jobs AS parent
                        WHERE parent.id = jobs_workflow_edges.parent_id
                          AND (parent.status NOT IN ('done'::job_status,
                                                     'dead'::job_status,
                                                     'cancelled'::job_status))))))) RETURNING jobs.id;
