DELETE
FROM jobs_workers
WHERE jobs_workers.expires_at < now();
