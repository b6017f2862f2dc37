DELETE
FROM jobs_workers
WHERE jobs_workers.expires_at < statement_timestamp();
