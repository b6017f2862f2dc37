SELECT jobs.status,
       jobs.result
FROM jobs
WHERE jobs.id = %(id)s::BIGINT;
