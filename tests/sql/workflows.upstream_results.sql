SELECT found.step,
       found.id,
       found.status,
       found.result
FROM
  (SELECT jobs.step AS step,
          jobs.id AS id,
          jobs.status AS status,
          jobs.result AS result
   FROM jobs
   WHERE jobs.id IN
       (SELECT jobs_workflow_edges.parent_id
        FROM jobs_workflow_edges
        WHERE jobs_workflow_edges.child_id = %(job_id)s::BIGINT)
   UNION ALL SELECT jobs_archive.step AS step,
                    jobs_archive.id AS id,
                    jobs_archive.status AS status,
                    jobs_archive.result AS result
   FROM jobs_archive
   WHERE jobs_archive.id IN
       (SELECT jobs_workflow_edges.parent_id
        FROM jobs_workflow_edges
        WHERE jobs_workflow_edges.child_id = %(job_id)s::BIGINT)) AS found
ORDER BY found.id;
