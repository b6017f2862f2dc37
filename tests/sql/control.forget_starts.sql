DELETE
FROM jobs_rate_starts
WHERE jobs_rate_starts.scope = %(scope)s::VARCHAR
  AND jobs_rate_starts.name = %(name)s::VARCHAR
  AND jobs_rate_starts.started_at < clock_timestamp() - interval '1 second' * %(older_than)s;
