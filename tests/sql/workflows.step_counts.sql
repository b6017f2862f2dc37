SELECT "both".status,
       count(*) AS n
FROM
  (SELECT jobs.status AS status
   FROM jobs
   WHERE jobs.workflow_id = %(workflow_id)s::UUID
   UNION ALL SELECT jobs_archive.status AS status
   FROM jobs_archive
   WHERE jobs_archive.workflow_id = %(workflow_id)s::UUID) AS "both"
GROUP BY "both".status;
