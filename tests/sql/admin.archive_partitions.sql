SELECT anon_1.partition,
       anon_1.lower_bound,
       anon_1.upper_bound,
       anon_1.id_check,

  (SELECT pg_class.reltuples
   FROM pg_class
   WHERE pg_class.oid = to_regclass(quote_ident(anon_1.partition))) AS estimated_rows
FROM jobs_archive_partitions() AS anon_1
ORDER BY anon_1.lower_bound ASC NULLS FIRST;
