UPDATE jobs
SET status=CASE
               WHEN (EXISTS
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
                                                                   'cancelled'::job_status))))))) THEN 'waiting'::job_status
               ELSE 'queued'::job_status
           END,
           run_at=statement_timestamp(),
           locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                              attempts=%(attempts)s::INTEGER,
                                                              worker=%(worker)s::VARCHAR,
                                                              finished_at=%(finished_at)s::TIMESTAMP WITH TIME ZONE,
                                                                                                               snoozes=%(snoozes)s::INTEGER,
                                                                                                               cancel_requested_at=%(cancel_requested_at)s::TIMESTAMP WITH TIME ZONE
WHERE jobs.id = ANY (%(ids)s::BIGINT[])
  AND jobs.status IN ('done'::job_status,
                      'dead'::job_status,
                      'cancelled'::job_status) RETURNING jobs.id,
                                                         jobs.status;
