WITH RECURSIVE hours_before(hour, id) AS
  (
     (SELECT date_bin(interval '1 hour', jobs.created_at, timestamptz '2000-01-01 00:00:00+00') AS hour,
             jobs.id AS id
      FROM jobs
      WHERE date_bin(interval '1 hour', jobs.created_at, timestamptz '2000-01-01 00:00:00+00') < date_bin(interval '1 hour', statement_timestamp() - interval '1 second' * %(older_than)s, timestamptz '2000-01-01 00:00:00+00')
      ORDER BY date_bin(interval '1 hour', jobs.created_at, timestamptz '2000-01-01 00:00:00+00') DESC, jobs.id DESC
      LIMIT 1)
   UNION ALL SELECT next_hour_before.hour AS hour,
                    next_hour_before.id AS id
   FROM hours_before
   JOIN LATERAL
     (SELECT date_bin(interval '1 hour', jobs.created_at, timestamptz '2000-01-01 00:00:00+00') AS hour,
             jobs.id AS id
      FROM jobs
      WHERE date_bin(interval '1 hour', jobs.created_at, timestamptz '2000-01-01 00:00:00+00') < hours_before.hour
      ORDER BY date_bin(interval '1 hour', jobs.created_at, timestamptz '2000-01-01 00:00:00+00') DESC, jobs.id DESC
      LIMIT 1) AS next_hour_before ON true)
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
       jobs.step,
       jobs.workflow_leaf
FROM jobs
WHERE jobs.created_at <
    (SELECT statement_timestamp() - interval '1 second' * %(older_than)s AS anon_1)
  AND jobs.id <=
    (SELECT max(ids_before.id) AS max_1
     FROM
       (SELECT hours_before.id AS id
        FROM hours_before
        UNION ALL SELECT anon_2.id AS id
        FROM
          (SELECT date_bin(interval '1 hour', jobs.created_at, timestamptz '2000-01-01 00:00:00+00') AS hour,
                  jobs.id AS id
           FROM jobs
           WHERE date_bin(interval '1 hour', jobs.created_at, timestamptz '2000-01-01 00:00:00+00') = date_bin(interval '1 hour', statement_timestamp() - interval '1 second' * %(older_than)s, timestamptz '2000-01-01 00:00:00+00')
             AND jobs.created_at < statement_timestamp() - interval '1 second' * %(older_than)s
           ORDER BY date_bin(interval '1 hour', jobs.created_at, timestamptz '2000-01-01 00:00:00+00') DESC, jobs.id DESC
           LIMIT 1) AS anon_2) AS ids_before)
  AND jobs.id > %(after_id)s::BIGINT
ORDER BY jobs.id
LIMIT %(limit)s::INTEGER;
