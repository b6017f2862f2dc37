SELECT jobs.id,
       jobs.kind,
       jobs.queue,
       jobs.priority,
       jobs.payload,
       jobs.status,
       jobs.run_at,
       jobs.locked_until,
       jobs.attempts,
       jobs.max_attempts,
       jobs.idempotency_key,
       jobs.worker,
       jobs.last_error,
       jobs.created_at,
       jobs.finished_at,
       jobs.result,
       jobs.timeout,
       jobs.snoozes,
       jobs.cancel_requested_at,
       jobs.attempted_at,
       jobs.errors,
       jobs.meta,
       jobs.tags,
       jobs.workflow_id,
       jobs.step
FROM jobs
WHERE jobs.created_at >= statement_timestamp() - interval '1 second' * %(newer_than)s
  AND jobs.id >=
    (SELECT min(since.id) AS min_1
     FROM
       (SELECT jobs.id + %(id_1)s::BIGINT AS id
        FROM jobs
        WHERE jobs.created_at >=
            (SELECT statement_timestamp() - interval '1 second' * %(newer_than)s AS anon_1)
          AND jobs.created_at <=
            (SELECT CAST(%(param_1)s::VARCHAR AS TIMESTAMP WITH TIME ZONE) AS anon_2)
        ORDER BY jobs.created_at,
                 jobs.id) AS since)
ORDER BY jobs.id DESC
LIMIT %(limit)s::INTEGER;
