SELECT %(param_1)s::INTEGER AS anon_1
FROM jobs
LIMIT %(param_2)s::INTEGER;
