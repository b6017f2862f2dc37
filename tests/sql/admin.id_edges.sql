SELECT min(jobs.id) AS min_1,
       max(jobs.id) AS max_1
FROM jobs;
