"""An install's schema as PostgreSQL's catalog describes it: every relation, column, constraint,
index, function, trigger, view, type and statistics object, by name, from the catalog's own
``pg_get_*def`` functions, comparable between two databases."""

from __future__ import annotations

import asyncpg

CATALOG = """
SELECT 'relation ' || c.relname, c.relkind::text || ' ' || c.relpersistence::text || ' '
       || COALESCE(array_to_string(c.reloptions, ','), '')
FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'v', 'S')
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname,
       a.attnum || ' ' || format_type(a.atttypid, a.atttypmod) || ' not null ' || a.attnotnull
       || ' identity ' || a.attidentity::text
       || ' default ' || COALESCE(pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'v')
  AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || r.relname || '.' || c.conname, pg_get_constraintdef(c.oid)
FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid
WHERE c.connamespace = $1::regnamespace
UNION ALL
SELECT 'index ' || c.relname, pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = $1::regnamespace
UNION ALL
SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
       pg_get_functiondef(p.oid)
FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
UNION ALL
SELECT 'trigger ' || t.tgname, pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = $1::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'view ' || c.relname, pg_get_viewdef(c.oid)
FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'v'
UNION ALL
SELECT 'type ' || t.typname, array_to_string(ARRAY(
           SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder),
       ',')
FROM pg_type t WHERE t.typnamespace = $1::regnamespace AND t.typtype = 'e'
UNION ALL
SELECT 'statistics ' || s.stxname, pg_get_statisticsobjdef(s.oid)
FROM pg_statistic_ext s WHERE s.stxnamespace = $1::regnamespace
"""


async def describe(conn: asyncpg.Connection, schema: str) -> dict[str, str]:
    """Every object of ``schema`` by kind and name; its definition. Alembic's version table is
    left out (only the migrations have one). Names in definitions are schema-qualified whatever
    the connection's ``search_path``."""
    async with conn.transaction():
        await conn.execute("SET LOCAL search_path TO pg_catalog")
        rows = await conn.fetch(CATALOG, schema)
    return {name: definition for name, definition in rows if "alembic_version" not in name}
