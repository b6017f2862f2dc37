INSERT INTO jobs_workflow_edges (child_id, parent_id, workflow_id, requires, appended)
SELECT edges.c,
       edges.p,
       %(workflow_id)s::UUID AS anon_1,
       edges.r,
       edges.a
FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS edges(c BIGINT, p BIGINT, r TEXT, a BOOLEAN);
