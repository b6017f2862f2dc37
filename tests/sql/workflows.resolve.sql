SELECT jobs_workflow_resolve(%(parent_ids)s::BIGINT[]) AS jobs_workflow_resolve_1;
