SELECT array(
               (SELECT unnest(%(queues)s::TEXT[]) AS name
                EXCEPT SELECT jobs_controls.name
                FROM jobs_controls
                WHERE jobs_controls.scope = %(param_1)s::VARCHAR
                  AND (jobs_controls.paused
                       OR (coalesce(jobs_controls.concurrency, jobs_controls.declared_concurrency) IS NOT NULL
                           OR coalesce(jobs_controls.rate_count, jobs_controls.declared_rate_count) IS NOT NULL)
                       AND jobs_controls.name != ALL (%(locked_queues)s::TEXT[])))) AS array_1;
