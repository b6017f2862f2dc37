SELECT "both".status,
       count(*) AS n,
       count(*) FILTER (
                        WHERE "both".archived) AS archived
FROM
  (SELECT jobs.status AS status,
          false AS archived
   FROM jobs
   WHERE jobs.workflow_id = %(workflow_id)s::UUID
   UNION ALL SELECT jobs_archive.status AS status,
                    true AS anon_1
   FROM jobs_archive
   WHERE jobs_archive.workflow_id = %(workflow_id)s::UUID) AS "both"
GROUP BY "both".status;
