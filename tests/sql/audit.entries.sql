SELECT jobs_audit.id,
       jobs_audit.at,
       jobs_audit.actor,
       jobs_audit.action,
       jobs_audit.scope,
       jobs_audit.target,
       jobs_audit.detail
FROM jobs_audit
WHERE jobs_audit.scope = %(scope)s::VARCHAR
  AND jobs_audit.target = %(target)s::VARCHAR
  AND jobs_audit.id < %(before_id)s::BIGINT
ORDER BY jobs_audit.id DESC
LIMIT %(limit)s::INTEGER;
