UPDATE jobs_periodic
SET expression=%(b_expression)s::VARCHAR,
    last_tick=%(b_last_tick)s::TIMESTAMP WITH TIME ZONE,
                                                   last_job_id=coalesce(%(b_job_id)s::BIGINT, jobs_periodic.last_job_id),
                                                   updated_at=statement_timestamp()
WHERE jobs_periodic.name = %(b_name)s::VARCHAR;
