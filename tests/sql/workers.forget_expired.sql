DELETE
FROM jobs_workers
WHERE jobs_workers.id IN
    (SELECT jobs_workers.id
     FROM jobs_workers
     WHERE jobs_workers.expires_at < statement_timestamp()
       FOR
       UPDATE SKIP LOCKED);
