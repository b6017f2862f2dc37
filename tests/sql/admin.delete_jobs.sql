WITH picked AS MATERIALIZED
  (SELECT jobs.id AS id
   FROM jobs
   WHERE jobs.status IN ('done'::job_status)
     AND jobs.queue = %(queue)s::VARCHAR
     FOR
     UPDATE SKIP LOCKED)
DELETE
FROM jobs USING picked
WHERE jobs.id = picked.id RETURNING jobs.id;
