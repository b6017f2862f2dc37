SELECT statement_timestamp() AS statement_timestamp_1;
