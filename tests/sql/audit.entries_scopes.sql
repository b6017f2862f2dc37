SELECT scopes.id,
       scopes.at,
       scopes.actor,
       scopes.action,
       scopes.scope,
       scopes.target,
       scopes.detail
FROM (
        (SELECT jobs_audit.id AS id,
                jobs_audit.at AS at,
                jobs_audit.actor AS actor,
                jobs_audit.action AS action,
                jobs_audit.scope AS scope,
                jobs_audit.target AS target,
                jobs_audit.detail AS detail
         FROM jobs_audit
         WHERE jobs_audit.scope = %(scope_0)s::VARCHAR
         ORDER BY jobs_audit.id DESC
         LIMIT %(limit)s::INTEGER)
      UNION ALL
        (SELECT jobs_audit.id AS id,
                jobs_audit.at AS at,
                jobs_audit.actor AS actor,
                jobs_audit.action AS action,
                jobs_audit.scope AS scope,
                jobs_audit.target AS target,
                jobs_audit.detail AS detail
         FROM jobs_audit
         WHERE jobs_audit.scope = %(scope_1)s::VARCHAR
         ORDER BY jobs_audit.id DESC
         LIMIT %(limit)s::INTEGER)) AS scopes
ORDER BY scopes.id DESC
LIMIT %(limit)s::INTEGER;
