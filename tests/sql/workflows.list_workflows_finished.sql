WITH RECURSIVE walk(id) AS
  (SELECT
     (SELECT jobs.workflow_id
      FROM jobs
      WHERE jobs.workflow_id IS NOT NULL
        AND jobs.workflow_id < %(before)s::UUID
      ORDER BY jobs.workflow_id DESC
      LIMIT %(param_1)s::INTEGER) AS id
   UNION ALL SELECT
     (SELECT jobs.workflow_id
      FROM jobs
      WHERE jobs.workflow_id IS NOT NULL
        AND jobs.workflow_id < prior.id
      ORDER BY jobs.workflow_id DESC
      LIMIT %(param_2)s::INTEGER) AS anon_1
   FROM walk AS
   prior
   WHERE prior.id IS NOT NULL)
SELECT page.id,
       figures.size,
       figures.queued,
       figures.running,
       figures.done,
       figures.dead,
       figures.cancelled,
       figures.waiting,
       figures.created_at,
       figures.finished_at
FROM
  (SELECT walk.id AS id
   FROM walk
   WHERE walk.id IS NOT NULL
     AND NOT (
                (SELECT jobs.workflow_id
                 FROM jobs
                 WHERE jobs.workflow_id IS NOT NULL
                   AND jobs.workflow_id <= walk.id
                   AND jobs.status =
                     (SELECT 'waiting'::job_status)
                 ORDER BY jobs.workflow_id DESC
                 LIMIT %(param_3)s::INTEGER) IS NOT DISTINCT
              FROM walk.id
              OR
                (SELECT jobs.workflow_id
                 FROM jobs
                 WHERE jobs.workflow_id IS NOT NULL
                   AND jobs.workflow_id <= walk.id
                   AND jobs.status =
                     (SELECT 'queued'::job_status)
                 ORDER BY jobs.workflow_id DESC
                 LIMIT %(param_4)s::INTEGER) IS NOT DISTINCT
              FROM walk.id
              OR
                (SELECT jobs.workflow_id
                 FROM jobs
                 WHERE jobs.workflow_id IS NOT NULL
                   AND jobs.workflow_id <= walk.id
                   AND jobs.status =
                     (SELECT 'running'::job_status)
                 ORDER BY jobs.workflow_id DESC
                 LIMIT %(param_5)s::INTEGER) IS NOT DISTINCT
              FROM walk.id)
   LIMIT %(limit)s::INTEGER) AS page
JOIN LATERAL
  (SELECT count(*) AS size,
          count(*) FILTER (
                           WHERE jobs.status = 'queued'::job_status) AS queued,
          count(*) FILTER (
                           WHERE jobs.status = 'running'::job_status) AS running,
          count(*) FILTER (
                           WHERE jobs.status = 'done'::job_status) AS done,
          count(*) FILTER (
                           WHERE jobs.status = 'dead'::job_status) AS dead,
          count(*) FILTER (
                           WHERE jobs.status = 'cancelled'::job_status) AS cancelled,
          count(*) FILTER (
                           WHERE jobs.status = 'waiting'::job_status) AS waiting,
          min(jobs.created_at) AS created_at,
          CASE
              WHEN (count(*) FILTER (
                                     WHERE jobs.status IN ('waiting'::job_status, 'queued'::job_status, 'running'::job_status)) = 0) THEN max(jobs.finished_at)
          END AS finished_at
   FROM jobs
   WHERE jobs.workflow_id = page.id) AS figures ON true
ORDER BY page.id DESC;
