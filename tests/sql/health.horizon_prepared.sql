SELECT pg_prepared_xacts.gid,
       pg_prepared_xacts.owner,
       pg_prepared_xacts.prepared,
       EXTRACT(epoch
               FROM statement_timestamp() - pg_prepared_xacts.prepared) AS age_seconds,
       age(pg_prepared_xacts.transaction) AS xid_age
FROM pg_prepared_xacts
WHERE pg_prepared_xacts.database = current_database()
ORDER BY pg_prepared_xacts.prepared;
