SELECT jobs_archive.id,
       jobs_archive.kind,
       jobs_archive.queue,
       jobs_archive.priority,
       jobs_archive.payload,
       jobs_archive.status,
       jobs_archive.run_at,
       jobs_archive.locked_until,
       jobs_archive.attempts,
       jobs_archive.max_attempts,
       jobs_archive.idempotency_key,
       jobs_archive.worker,
       jobs_archive.last_error,
       jobs_archive.created_at,
       jobs_archive.finished_at,
       jobs_archive.archived_at
FROM jobs_archive
WHERE jobs_archive.id = %(id)s::BIGINT;
