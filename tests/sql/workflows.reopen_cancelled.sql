UPDATE jobs
SET status='waiting'::job_status,
    run_at=statement_timestamp(),
    locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE,
                                                       attempts=%(attempts)s::INTEGER,
                                                       worker=%(worker)s::VARCHAR,
                                                       finished_at=%(finished_at)s::TIMESTAMP WITH TIME ZONE,
                                                                                                        snoozes=%(snoozes)s::INTEGER,
                                                                                                        cancel_requested_at=%(cancel_requested_at)s::TIMESTAMP WITH TIME ZONE
WHERE jobs.id = ANY (%(ids)s::BIGINT[])
  AND jobs.status = 'cancelled'::job_status
  AND NOT (EXISTS
             (SELECT *
              FROM jobs_workflow_edges
              WHERE jobs_workflow_edges.child_id = jobs.id
                AND jobs_workflow_edges.requires = %(requires_1)s::VARCHAR
                AND jobs_workflow_edges.parent_outcome IS NOT NULL
                AND jobs_workflow_edges.parent_outcome != %(parent_outcome_1)s::VARCHAR
                AND jobs_workflow_edges.parent_id != ALL (%(kept)s::BIGINT[]))) RETURNING jobs.id;
