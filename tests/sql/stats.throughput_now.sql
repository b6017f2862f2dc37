SELECT clock.taken_at,
       counts.minute,
       counts.done,
       counts.dead
FROM
  (SELECT statement_timestamp() AS taken_at) AS clock
LEFT OUTER JOIN
  (SELECT date_trunc('minute', jobs.finished_at) AS minute,
          count(*) FILTER (
                           WHERE jobs.status = 'done'::job_status) AS done,
          count(*) FILTER (
                           WHERE jobs.status = 'dead'::job_status) AS dead
   FROM jobs
   WHERE jobs.status IN ('done'::job_status,
                         'dead'::job_status)
     AND jobs.finished_at >= date_trunc('minute', statement_timestamp()) - interval '1 second' * %(span)s
   GROUP BY date_trunc('minute', jobs.finished_at)
   ORDER BY date_trunc('minute', jobs.finished_at)) AS counts ON true
ORDER BY counts.minute;
