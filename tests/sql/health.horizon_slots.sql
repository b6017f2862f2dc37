SELECT pg_replication_slots.slot_name,
       pg_replication_slots.slot_type,
       pg_replication_slots.active,
       age(pg_replication_slots.xmin) AS xmin_age,
       age(pg_replication_slots.catalog_xmin) AS catalog_xmin_age,
       greatest(age(pg_replication_slots.xmin), age(pg_replication_slots.catalog_xmin)) AS xid_age,
       pg_wal_lsn_diff(CASE
                           WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                           ELSE pg_current_wal_lsn()
                       END, pg_replication_slots.restart_lsn) AS retained_wal_bytes
FROM pg_replication_slots
WHERE (pg_replication_slots.xmin IS NOT NULL
       OR pg_replication_slots.catalog_xmin IS NOT NULL
       OR NOT pg_replication_slots.active)
  AND (pg_replication_slots.database IS NULL
       OR pg_replication_slots.database = current_database())
ORDER BY greatest(age(pg_replication_slots.xmin), age(pg_replication_slots.catalog_xmin)) DESC NULLS LAST, pg_replication_slots.slot_name;
