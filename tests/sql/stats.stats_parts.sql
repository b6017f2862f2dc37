SELECT %(param_1)s::VARCHAR AS part,
       part_0.queue,
       part_0.kind,
       part_0.ready,
       part_0.scheduled,
       part_0.waiting,
       part_0.dead,
       part_0.cancelled,
       part_0.oldest_ready,
       CAST(NULL AS INTEGER) AS running,
       CAST(NULL AS INTEGER) AS expired,
       CAST(NULL AS INTEGER) AS done_last_minute,
       CAST(NULL AS INTEGER) AS done_last_hour
FROM
  (SELECT newest.queue AS queue,
          newest.kind AS kind,
          count(*) FILTER (
                           WHERE newest.status = 'queued'::job_status
                             AND newest.run_at <= statement_timestamp()) AS ready,
          count(*) FILTER (
                           WHERE newest.status = 'queued'::job_status
                             AND NOT (newest.status = 'queued'::job_status
                                      AND newest.run_at <= statement_timestamp())) AS scheduled,
          count(*) FILTER (
                           WHERE newest.status = 'waiting'::job_status) AS waiting,
          count(*) FILTER (
                           WHERE newest.status = 'dead'::job_status) AS dead,
          count(*) FILTER (
                           WHERE newest.status = 'cancelled'::job_status) AS cancelled,
          EXTRACT(epoch
                  FROM statement_timestamp() - (min(newest.run_at) FILTER (
                                                                           WHERE newest.status = 'queued'::job_status
                                                                             AND newest.run_at <= statement_timestamp()))) AS oldest_ready
   FROM
     (SELECT jobs.queue AS queue,
             jobs.kind AS kind,
             jobs.status AS status,
             jobs.run_at AS run_at
      FROM jobs
      WHERE jobs.status = ANY (ARRAY['dead'::job_status])
      ORDER BY jobs.status DESC,
               jobs.id DESC
      LIMIT %(size)s::INTEGER) AS newest
   GROUP BY newest.queue,
            newest.kind) AS part_0
UNION ALL
SELECT %(param_2)s::VARCHAR AS part,
       part_1.queue,
       part_1.kind,
       CAST(NULL AS INTEGER) AS ready,
       CAST(NULL AS INTEGER) AS scheduled,
       CAST(NULL AS INTEGER) AS waiting,
       CAST(NULL AS INTEGER) AS dead,
       CAST(NULL AS INTEGER) AS cancelled,
       CAST(NULL AS INTEGER) AS oldest_ready,
       part_1.running,
       part_1.expired,
       CAST(NULL AS INTEGER) AS done_last_minute,
       CAST(NULL AS INTEGER) AS done_last_hour
FROM
  (SELECT jobs.queue AS queue,
          jobs.kind AS kind,
          count(*) AS running,
          count(*) FILTER (
                           WHERE jobs.locked_until < statement_timestamp()) AS expired
   FROM jobs
   WHERE jobs.status = 'running'::job_status
   GROUP BY jobs.queue,
            jobs.kind) AS part_1
UNION ALL
SELECT %(param_3)s::VARCHAR AS part,
       part_2.queue,
       part_2.kind,
       CAST(NULL AS INTEGER) AS ready,
       CAST(NULL AS INTEGER) AS scheduled,
       CAST(NULL AS INTEGER) AS waiting,
       CAST(NULL AS INTEGER) AS dead,
       CAST(NULL AS INTEGER) AS cancelled,
       CAST(NULL AS INTEGER) AS oldest_ready,
       CAST(NULL AS INTEGER) AS running,
       CAST(NULL AS INTEGER) AS expired,
       part_2.done_last_minute,
       part_2.done_last_hour
FROM
  (SELECT jobs.queue AS queue,
          jobs.kind AS kind,
          count(*) FILTER (
                           WHERE jobs.finished_at >= statement_timestamp() - interval '1 second' * %(param_4)s) AS done_last_minute,
          count(*) AS done_last_hour
   FROM jobs
   WHERE jobs.status = 'done'::job_status
     AND jobs.finished_at >= statement_timestamp() - interval '1 second' * %(param_5)s
   GROUP BY jobs.queue,
            jobs.kind) AS part_2;
