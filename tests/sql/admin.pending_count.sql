SELECT count(*) FILTER (
                        WHERE jobs.status = 'running'::job_status
                          OR jobs.status = 'queued'::job_status
                          AND jobs.run_at <= statement_timestamp()
                          AND NOT (jobs.queue IN
                                     (SELECT jobs_controls.name
                                      FROM jobs_controls
                                      WHERE jobs_controls.scope = %(param_1)s::VARCHAR
                                        AND jobs_controls.paused)
                                   OR jobs.kind IN
                                     (SELECT jobs_controls.name
                                      FROM jobs_controls
                                      WHERE jobs_controls.scope = %(param_2)s::VARCHAR
                                        AND jobs_controls.paused))) AS pending,
       count(*) FILTER (
                        WHERE jobs.status = 'queued'::job_status
                          AND jobs.run_at <= statement_timestamp()
                          AND (jobs.queue IN
                                 (SELECT jobs_controls.name
                                  FROM jobs_controls
                                  WHERE jobs_controls.scope = %(param_1)s::VARCHAR
                                    AND jobs_controls.paused)
                               OR jobs.kind IN
                                 (SELECT jobs_controls.name
                                  FROM jobs_controls
                                  WHERE jobs_controls.scope = %(param_2)s::VARCHAR
                                    AND jobs_controls.paused))) AS paused
FROM jobs
WHERE jobs.kind = ANY (%(param_3)s::TEXT[])
  AND jobs.queue = ANY (%(param_4)s::TEXT[])
  AND (jobs.status = 'queued'::job_status
       AND jobs.run_at <= statement_timestamp()
       OR jobs.status = 'running'::job_status);
