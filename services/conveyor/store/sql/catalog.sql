-- Statements that read only PostgreSQL's catalogs (``catalog``: they name no Conveyor schema).
-- Run on a connection of their own (``conveyor migrate``, ``--create-roles``), not through Store.

-- name: database_exists catalog
SELECT 1 FROM pg_database WHERE datname = $1

-- name: role_find catalog
-- Which of the given role names exist.
SELECT rolname FROM pg_roles WHERE rolname = ANY($1::text[])

-- name: role_login_sql catalog
-- CREATE/ALTER ROLE take no parameters: the server quotes the name ($1) and the password's
-- verifier ($2) with format, and the caller runs the text it returns.
SELECT format(CASE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)
                   THEN 'ALTER ROLE %I LOGIN PASSWORD %L'
                   ELSE 'CREATE ROLE %I LOGIN PASSWORD %L' END, $1::text, $2::text)

-- name: role_jit_off_sql catalog
SELECT format('ALTER ROLE %I SET jit = off', $1::text)

-- name: role_set_sql catalog
-- A session bound (bounds.py) as a role setting: names from SessionBounds.server_settings,
-- values quoted.
SELECT format('ALTER ROLE %I SET %s = %L', $1::text, $2::text, $3::text)
