SELECT jobs_archive.status,
       jobs_archive.result
FROM jobs_archive
WHERE jobs_archive.id = %(id)s::BIGINT;
