"""PostgreSQL: the schema (one source for alembic), connections and the store (all SQL)."""
