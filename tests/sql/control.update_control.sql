UPDATE jobs_controls
SET concurrency=%(new_concurrency)s::INTEGER,
    rate_count=%(new_rate_count)s::INTEGER,
    updated_at=statement_timestamp()
WHERE jobs_controls.scope = %(scope)s::VARCHAR
  AND jobs_controls.name = %(name)s::VARCHAR
  AND (jobs_controls.concurrency IS DISTINCT
       FROM %(new_concurrency)s::INTEGER
       OR jobs_controls.rate_count IS DISTINCT
       FROM %(new_rate_count)s::INTEGER) RETURNING jobs_controls.scope;
