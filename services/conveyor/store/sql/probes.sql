-- name: db_ping
SELECT 1

-- name: schema_version
SELECT max(version_num) FROM __schema__.alembic_version
