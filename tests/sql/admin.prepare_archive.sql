SELECT jobs_archive_prepare(statement_timestamp()) AS changes;
