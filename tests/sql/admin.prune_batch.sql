WITH picked AS MATERIALIZED
  (SELECT jobs_archive.id AS id
   FROM jobs_archive
   WHERE jobs_archive.finished_at < statement_timestamp() - interval '1 second' * %(age)s
   LIMIT %(batch)s::INTEGER
   FOR UPDATE SKIP LOCKED)
DELETE
FROM jobs_archive USING picked
WHERE jobs_archive.id = picked.id RETURNING jobs_archive.id;
