WITH live_steps AS MATERIALIZED
  (SELECT jobs.id AS id
   FROM jobs
   WHERE jobs.workflow_id = %(workflow_id)s::UUID), archived_steps AS MATERIALIZED
  (SELECT jobs_archive.id AS id
   FROM jobs_archive
   WHERE jobs_archive.workflow_id = %(workflow_id)s::UUID)
SELECT found.id,
       found.step,
       found.kind,
       found.status,
       found.last_error,
       found.waiting_on,
       found.archived,
       found.depends_on,
       found.attempts,
       found.snoozes
FROM
  (SELECT jobs.id AS id,
          jobs.step AS step,
          jobs.kind AS kind,
          jobs.status AS status,
          jobs.last_error AS last_error,

     (SELECT coalesce(array_agg(coalesce(parent.step, CAST(parent.id AS TEXT))
                                ORDER BY jobs_workflow_edges.parent_id) FILTER (
                                                                                WHERE (parent.status NOT IN ('done'::job_status, 'dead'::job_status, 'cancelled'::job_status))), CAST(%(param_1)s::VARCHAR AS TEXT[])) AS coalesce_1
      FROM jobs_workflow_edges
      JOIN jobs AS parent ON parent.id = jobs_workflow_edges.parent_id
      WHERE jobs_workflow_edges.child_id = jobs.id
        AND jobs_workflow_edges.parent_outcome IS NULL) AS waiting_on,
          false AS archived,

     (SELECT coalesce(array_agg(coalesce(parent.step, CAST(jobs_workflow_edges.parent_id AS TEXT))
                                ORDER BY jobs_workflow_edges.parent_id), CAST(%(param_2)s::VARCHAR AS TEXT[])) AS coalesce_2
      FROM jobs_workflow_edges
      LEFT OUTER JOIN jobs AS parent ON parent.id = jobs_workflow_edges.parent_id
      WHERE jobs_workflow_edges.child_id = jobs.id) AS depends_on,
                   jobs.attempts AS attempts,
                   jobs.snoozes AS snoozes
   FROM jobs
   WHERE jobs.id = ANY (array(
                                (SELECT "both".id
                                 FROM (
                                         (SELECT live_steps.id AS id
                                          FROM live_steps
                                          WHERE live_steps.id > %(after_id)s::BIGINT
                                          ORDER BY live_steps.id
                                          LIMIT %(limit)s::INTEGER)
                                       UNION ALL
                                         (SELECT archived_steps.id AS id
                                          FROM archived_steps
                                          WHERE archived_steps.id > %(after_id)s::BIGINT
                                          ORDER BY archived_steps.id
                                          LIMIT %(limit)s::INTEGER)) AS "both"
                                 ORDER BY "both".id
                                 LIMIT %(limit)s::INTEGER)))
   UNION ALL SELECT jobs_archive.id AS id,
                    jobs_archive.step AS step,
                    jobs_archive.kind AS kind,
                    jobs_archive.status AS status,
                    jobs_archive.last_error AS last_error,
                    CAST(%(param_3)s::VARCHAR AS TEXT[]) AS waiting_on,
                    true AS archived,
                            CAST(%(param_4)s::VARCHAR AS TEXT[]) AS depends_on,
                            jobs_archive.attempts AS attempts,
                            jobs_archive.snoozes AS snoozes
   FROM jobs_archive
   WHERE jobs_archive.id = ANY (array(
                                        (SELECT "both".id
                                         FROM (
                                                 (SELECT live_steps.id AS id
                                                  FROM live_steps
                                                  WHERE live_steps.id > %(after_id)s::BIGINT
                                                  ORDER BY live_steps.id
                                                  LIMIT %(limit)s::INTEGER)
                                               UNION ALL
                                                 (SELECT archived_steps.id AS id
                                                  FROM archived_steps
                                                  WHERE archived_steps.id > %(after_id)s::BIGINT
                                                  ORDER BY archived_steps.id
                                                  LIMIT %(limit)s::INTEGER)) AS "both"
                                         ORDER BY "both".id
                                         LIMIT %(limit)s::INTEGER)))) AS found
ORDER BY found.id;
