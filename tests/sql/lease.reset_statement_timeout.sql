
RESET statement_timeout;
