SELECT count(*) AS count_1
FROM jobs
WHERE jobs.kind = ANY (%(param_1)s::TEXT[])
  AND jobs.queue = ANY (%(param_2)s::TEXT[])
  AND jobs.status = 'queued'::job_status
  AND jobs.run_at > statement_timestamp()
  AND jobs.run_at <= statement_timestamp() + interval '1 second' * %(horizon)s;
