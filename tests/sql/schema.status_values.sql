SELECT unnest(enum_range(NULL::job_status))::text;
