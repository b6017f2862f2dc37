SELECT count(*) AS count_1
FROM
  (SELECT %(param_1)s::INTEGER AS one
   FROM jobs
   WHERE jobs.status IN ('dead'::job_status,
                         'cancelled'::job_status)
   LIMIT %(cap)s::INTEGER) AS "some";
