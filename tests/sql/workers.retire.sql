DELETE
FROM jobs_workers
WHERE jobs_workers.id = %(worker)s::VARCHAR;
