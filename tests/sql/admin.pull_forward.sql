UPDATE jobs
SET run_at=now()
WHERE jobs.kind = ANY (%(param_1)s::TEXT[])
  AND jobs.queue = ANY (%(param_2)s::TEXT[])
  AND jobs.status = 'queued'::job_status
  AND jobs.run_at > now()
  AND jobs.run_at <= now() + interval '1 second' * %(horizon)s RETURNING jobs.id;
