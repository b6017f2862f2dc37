
SET LOCAL synchronous_commit = off;
