INSERT INTO jobs_audit (actor, action, scope, target, detail)
VALUES (%(actor)s::VARCHAR, %(action)s::VARCHAR, %(scope)s::VARCHAR, %(target)s::VARCHAR, CAST(%(detail)s::VARCHAR AS JSONB)) RETURNING jobs_audit.id;
