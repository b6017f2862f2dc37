SELECT jobs_archive_drop_before(statement_timestamp() - interval '1 second' * %(age)s) AS dropped;
