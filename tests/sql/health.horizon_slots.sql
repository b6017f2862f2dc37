SELECT pg_replication_slots.slot_name,
       pg_replication_slots.slot_type,
       pg_replication_slots.active,
       age(pg_replication_slots.xmin) AS xmin_age,
       age(pg_replication_slots.catalog_xmin) AS catalog_xmin_age,
       greatest(age(pg_replication_slots.xmin), age(pg_replication_slots.catalog_xmin)) AS xid_age
FROM pg_replication_slots
WHERE (pg_replication_slots.xmin IS NOT NULL
       OR pg_replication_slots.catalog_xmin IS NOT NULL)
  AND (pg_replication_slots.database IS NULL
       OR pg_replication_slots.database = current_database())
ORDER BY greatest(age(pg_replication_slots.xmin), age(pg_replication_slots.catalog_xmin)) DESC;
