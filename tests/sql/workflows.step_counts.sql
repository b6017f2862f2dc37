SELECT "both".status,
       count(*) AS n,
       count(*) FILTER (
                        WHERE "both".live) AS live
FROM
  (SELECT jobs.status AS status,
          true AS live
   FROM jobs
   WHERE jobs.workflow_id = %(workflow_id)s::UUID
   UNION ALL SELECT jobs_archive.status AS status,
                    false AS live
   FROM jobs_archive
   WHERE jobs_archive.workflow_id = %(workflow_id)s::UUID) AS "both"
GROUP BY "both".status;
