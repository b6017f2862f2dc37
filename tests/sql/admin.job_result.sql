SELECT found.status,
       found.result
FROM
  (SELECT jobs.status AS status,
          jobs.result AS result
   FROM jobs
   WHERE jobs.id = %(id)s::BIGINT
   UNION ALL SELECT jobs_archive.status AS status,
                    jobs_archive.result AS result
   FROM jobs_archive
   WHERE jobs_archive.id = %(id)s::BIGINT) AS found
LIMIT %(param_1)s::INTEGER;
