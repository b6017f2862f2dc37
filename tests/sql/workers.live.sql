SELECT jobs_workers.id,
       jobs_workers.host,
       jobs_workers.pid,
       jobs_workers.version,
       jobs_workers.queues,
       jobs_workers.kinds,
       jobs_workers.concurrency,
       jobs_workers.started_at,
       jobs_workers.heartbeat_at,
       jobs_workers.expires_at,
       jobs_workers.running
FROM jobs_workers
WHERE jobs_workers.expires_at >= statement_timestamp()
ORDER BY jobs_workers.id;
