WITH picked AS MATERIALIZED
  (SELECT jobs_archive.id AS id,
          jobs_archive.archived_at AS archived_at,
          jobs_archive.workflow_id AS workflow_id,
          jobs_archive.finished_at AS finished_at
   FROM jobs_archive
   WHERE jobs_archive.finished_at >= coalesce(%(floor)s::TIMESTAMP WITH TIME ZONE, '-infinity'::timestamptz)
     AND jobs_archive.finished_at < statement_timestamp() - interval '1 second' * %(age)s
     AND (jobs_archive.workflow_id IS NULL
          OR
            (SELECT max(last_step.finished_at) AS max_1
             FROM jobs_archive AS last_step
             WHERE last_step.workflow_id = jobs_archive.workflow_id) < statement_timestamp() - interval '1 second' * %(age)s
          AND
            (SELECT 1
             FROM jobs AS other_step
             WHERE other_step.workflow_id = jobs_archive.workflow_id
             LIMIT %(param_1)s::INTEGER) IS NULL)
   ORDER BY jobs_archive.finished_at
   LIMIT %(batch)s::INTEGER
   FOR UPDATE SKIP LOCKED), units AS MATERIALIZED
  (SELECT DISTINCT picked.workflow_id AS workflow_id
   FROM picked
   WHERE picked.workflow_id IS NOT NULL), unit_steps AS MATERIALIZED
  (SELECT jobs_archive.id AS id,
          jobs_archive.archived_at AS archived_at,
          jobs_archive.workflow_id AS workflow_id,
          jobs_archive.finished_at < statement_timestamp() - interval '1 second' * %(age)s AS goes
   FROM jobs_archive
   WHERE jobs_archive.workflow_id = ANY (array(
                                                 (SELECT units.workflow_id
                                                  FROM units)))
     FOR
     UPDATE OF jobs_archive SKIP LOCKED), chosen AS MATERIALIZED
  (SELECT picked.id AS id,
          picked.archived_at AS archived_at
   FROM picked
   WHERE picked.workflow_id IS NULL
   UNION ALL SELECT unit_steps.id AS id,
                    unit_steps.archived_at AS archived_at
   FROM unit_steps
   WHERE unit_steps.workflow_id IN
       (SELECT unit_steps.workflow_id
        FROM unit_steps
        GROUP BY unit_steps.workflow_id
        HAVING bool_and(unit_steps.goes)
        AND count(*) =
          (SELECT count(*) AS count_1
           FROM jobs_archive AS any_step
           WHERE any_step.workflow_id = unit_steps.workflow_id)))
DELETE
FROM jobs_archive USING chosen
WHERE jobs_archive.id = chosen.id
  AND jobs_archive.archived_at = chosen.archived_at RETURNING jobs_archive.id,

  (SELECT max(picked.finished_at) AS max_2
   FROM picked) AS reached;
