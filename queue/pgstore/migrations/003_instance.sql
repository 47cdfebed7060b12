-- The identity of this schema's queue. A copy of the schema (pg_dump and
-- restore, a restored backup or snapshot) keeps it; a schema made afresh
-- gets another. A store's mark file names it beside the highest fence and
-- envelope number the store drew (see mark.go).
CREATE TABLE instance (
    id text NOT NULL
);
INSERT INTO instance (id) VALUES (md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text));
