WITH RECURSIVE walk(id) AS
  (SELECT greatest(
                     (SELECT jobs.workflow_id
                      FROM jobs
                      WHERE jobs.workflow_id IS NOT NULL
                        AND jobs.workflow_id < %(before)s::UUID
                      ORDER BY jobs.workflow_id DESC
                      LIMIT %(param_1)s::INTEGER),
                     (SELECT jobs_archive.workflow_id
                      FROM jobs_archive
                      WHERE jobs_archive.workflow_id IS NOT NULL
                        AND jobs_archive.workflow_id < %(before)s::UUID
                      ORDER BY jobs_archive.workflow_id DESC
                      LIMIT %(param_2)s::INTEGER)) AS id
   UNION ALL SELECT greatest(
                               (SELECT jobs.workflow_id
                                FROM jobs
                                WHERE jobs.workflow_id IS NOT NULL
                                  AND jobs.workflow_id < prior.id
                                ORDER BY jobs.workflow_id DESC
                                LIMIT %(param_3)s::INTEGER),
                               (SELECT jobs_archive.workflow_id
                                FROM jobs_archive
                                WHERE jobs_archive.workflow_id IS NOT NULL
                                  AND jobs_archive.workflow_id < prior.id
                                ORDER BY jobs_archive.workflow_id DESC
                                LIMIT %(param_4)s::INTEGER)) AS greatest_1
   FROM walk AS
   prior
   WHERE prior.id IS NOT NULL)
SELECT page.id,
       live.size + gone.size AS size,
       live.queued + gone.queued AS queued,
       live.running + gone.running AS running,
       live.done + gone.done AS done,
       live.dead + gone.dead AS dead,
       live.cancelled + gone.cancelled AS cancelled,
       live.waiting + gone.waiting AS waiting,
       gone.size AS archived,
       least(live.created_at, gone.created_at) AS created_at,
       CASE
           WHEN (live.open = 0) THEN greatest(live.finished_at, gone.finished_at)
       END AS finished_at
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
                 LIMIT %(param_5)s::INTEGER) IS NOT DISTINCT
              FROM walk.id
              OR
                (SELECT jobs.workflow_id
                 FROM jobs
                 WHERE jobs.workflow_id IS NOT NULL
                   AND jobs.workflow_id <= walk.id
                   AND jobs.status =
                     (SELECT 'queued'::job_status)
                 ORDER BY jobs.workflow_id DESC
                 LIMIT %(param_6)s::INTEGER) IS NOT DISTINCT
              FROM walk.id
              OR
                (SELECT jobs.workflow_id
                 FROM jobs
                 WHERE jobs.workflow_id IS NOT NULL
                   AND jobs.workflow_id <= walk.id
                   AND jobs.status =
                     (SELECT 'running'::job_status)
                 ORDER BY jobs.workflow_id DESC
                 LIMIT %(param_7)s::INTEGER) IS NOT DISTINCT
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
          count(*) FILTER (
                           WHERE jobs.status IN ('waiting'::job_status, 'queued'::job_status, 'running'::job_status)) AS open,
          min(jobs.created_at) AS created_at,
          max(jobs.finished_at) AS finished_at
   FROM jobs
   WHERE jobs.workflow_id = page.id) AS live ON true
JOIN LATERAL
  (SELECT count(*) AS size,
          count(*) FILTER (
                           WHERE jobs_archive.status = 'queued'::job_status) AS queued,
          count(*) FILTER (
                           WHERE jobs_archive.status = 'running'::job_status) AS running,
          count(*) FILTER (
                           WHERE jobs_archive.status = 'done'::job_status) AS done,
          count(*) FILTER (
                           WHERE jobs_archive.status = 'dead'::job_status) AS dead,
          count(*) FILTER (
                           WHERE jobs_archive.status = 'cancelled'::job_status) AS cancelled,
          count(*) FILTER (
                           WHERE jobs_archive.status = 'waiting'::job_status) AS waiting,
          count(*) FILTER (
                           WHERE jobs_archive.status IN ('waiting'::job_status, 'queued'::job_status, 'running'::job_status)) AS open,
          min(jobs_archive.created_at) AS created_at,
          max(jobs_archive.finished_at) AS finished_at
   FROM jobs_archive
   WHERE jobs_archive.workflow_id = page.id) AS gone ON true
ORDER BY page.id DESC;
