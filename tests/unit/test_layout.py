"""The code's layout, enforced: SQL and asyncpg only in ``services/conveyor/store/``, aio-pika
(and aiormq, pamqp) only in ``services/conveyor/broker/``; the package root holds the public API
and at most 10 modules; imports go one way through the layers (``LAYERS``); no import cycle
(function-local imports count: they must not dodge one) and no import of another module's
private name.

Each rule is a function of a source tree, so the tests below also plant a violation in a copy
and check that the rule catches it (a guard that cannot fail guards nothing)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
MAX_ROOT_MODULES = 10

# Calls that send SQL over a connection (asyncpg's and SQLAlchemy's names).
SQL_CALLS = frozenset(
    {"execute", "executemany", "fetch", "fetchrow", "fetchval", "prepare", "cursor",
     "copy_from_query", "copy_from_table", "copy_records_to_table", "copy_to_table",
     "exec_driver_sql"}
)  # fmt: skip
# A string literal that is a statement: a keyword sequence only SQL has, in upper case as the
# store writes it (prose in docstrings and messages is lower case or lacks the second keyword).
SQL_TEXT = re.compile(
    r"\bSELECT\b[\s\S]*\bFROM\b|\bSELECT\s+(?:1|\*|count\(|pg_|now\(|nextval\(|set_config)"
    r"|\bINSERT\s+INTO\b|\bUPDATE\s+\S+\s+SET\b|\bDELETE\s+FROM\b|\bTRUNCATE\b\s+\w"
    r"|\b(?:CREATE|ALTER|DROP)\s+(?:TABLE|INDEX|SCHEMA|TYPE|DATABASE|VIEW|FUNCTION|TRIGGER)\b"
    r"|\b(?:LISTEN|NOTIFY|UNLISTEN)\s+\w|\bpg_notify\s*\(|\bpg_(?:try_)?advisory"
)
BROKER_LIBS = ("aio_pika", "aiormq", "pamqp")
DATABASE_LIBS = ("asyncpg",)
# Each room of the package and its layer: a module imports from its own room and from rooms of
# lower layers only (rooms of one layer know nothing of each other). The root's modules
# (enqueue, workflows, the package itself) are the public API, above the jobs they submit.
LAYERS = {
    "core": 0,
    "store": 1,
    "broker": 1,
    "client": 1,
    "jobs": 2,
    "": 3,
    "worker": 4,
    "publisher": 4,
    "maintenance": 4,
    "api": 4,
    "testing": 5,
    "cli": 6,
}
SOURCE_SUFFIXES = (".py", ".js", ".css", ".html", ".sql", ".pyi")


def _python_files(root: Path) -> Iterator[Path]:
    yield from sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # an f-string: its literal parts
        return " ".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    return None


def sql_outside_store(package: Path) -> list[str]:
    """``file:line what`` for every SQL literal or SQL-running call outside ``package/store``."""
    problems = []
    store = package / "store"
    for path in _python_files(package):
        if store in path.parents:
            continue
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        where = path.relative_to(package.parent)
        for node in ast.walk(tree):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and func.attr in SQL_CALLS:
                problems.append(f"{where}:{node.lineno} calls .{func.attr}(...)")
            if isinstance(node, ast.JoinedStr) or (
                isinstance(node, ast.Constant) and id(node) not in docs
            ):
                text = _literal_text(node)
                if text is not None and SQL_TEXT.search(text):
                    problems.append(f"{where}:{node.lineno} SQL text {text.strip()[:60]!r}")
    return list(dict.fromkeys(problems))  # an f-string's parts are walked twice


def _is_dynamic_import(node: ast.AST) -> bool:
    """``importlib.import_module("x")`` or ``__import__("x")``."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in ("import_module", "__import__")
    )


def imports_outside(package: Path, libraries: tuple[str, ...], room: str) -> list[str]:
    """``file:line module`` for every import of ``libraries`` (also a dynamic one,
    ``importlib.import_module("aio_pika")``) outside ``package/room``."""
    problems = []
    home = package / room
    for path in _python_files(package):
        if home in path.parents:
            continue
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(package.parent)
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif _is_dynamic_import(node):
                assert isinstance(node, ast.Call)
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    names = [first.value]
            for name in names:
                if name.split(".")[0] in libraries:
                    problems.append(f"{where}:{node.lineno} imports {name}")
    return problems


def broker_imports_outside_broker(package: Path) -> list[str]:
    return imports_outside(package, BROKER_LIBS, "broker")


def _module_name(package: Path, path: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path) -> tuple[dict[str, set[str]], list[str]]:
    """The package's modules and the modules each imports (anywhere in it, a function body
    included), and ``file:line`` for every import of a ``_private`` name from another module."""
    files = {_module_name(package, p): p for p in _python_files(package)}
    graph: dict[str, set[str]] = {m: set() for m in files}
    private = []
    for mod, path in files.items():
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[mod] |= {a.name for a in node.names if a.name in files}
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            base = here.split(".")[: len(here.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target not in files:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                graph[mod].add(sub if sub in files else target)
                if sub not in files and alias.name.startswith("_") and target != mod:
                    where = path.relative_to(package.parent)
                    private.append(f"{where}:{node.lineno} imports {target}.{alias.name}")
    return graph, private


def import_cycles(package: Path) -> list[list[str]]:
    """Every set of modules that import each other, directly or around a loop (Tarjan)."""
    graph, _ = import_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    # a package's __init__ importing its own modules is no cycle unless they import it back
    return sorted(cycles)


def _room(package: Path, module: str) -> str:
    """The room of a module: its first package under the root ("" for the root's own modules)."""
    parts = module.split(".")[1:]
    return parts[0] if parts and (package / parts[0]).is_dir() else ""


def layer_violations(package: Path) -> list[str]:
    """``a -> b`` for every import of a module of another room that is not on a lower layer
    (a room missing from ``LAYERS`` is one too)."""
    graph, _ = import_graph(package)
    problems = []
    for module, imported in sorted(graph.items()):
        room = _room(package, module)
        for target in sorted(imported):
            other = _room(package, target)
            if other == room:
                continue
            if room not in LAYERS or other not in LAYERS or LAYERS[other] >= LAYERS[room]:
                problems.append(f"{module} -> {target}")
    return problems


def root_modules(package: Path) -> list[str]:
    return sorted(p.name for p in package.glob("*.py"))


def test_sql_only_in_the_store() -> None:
    assert sql_outside_store(SERVICES / "conveyor") == []


def test_aio_pika_only_in_the_broker_module() -> None:
    assert broker_imports_outside_broker(SERVICES / "conveyor") == []


def test_asyncpg_only_in_the_store() -> None:
    assert imports_outside(SERVICES / "conveyor", DATABASE_LIBS, "store") == []


def test_imports_go_down_the_layers() -> None:
    assert layer_violations(SERVICES / "conveyor") == []


def test_the_root_is_the_public_api() -> None:
    assert len(root_modules(SERVICES / "conveyor")) <= MAX_ROOT_MODULES, root_modules(
        SERVICES / "conveyor"
    )


def test_no_import_cycles() -> None:
    assert import_cycles(SERVICES / "conveyor") == []


def test_no_import_of_another_modules_private_name() -> None:
    assert import_graph(SERVICES / "conveyor")[1] == []


# ---------------------------------------------------------------- the guards can fail


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package's layout: a store, a broker and an api module, all clean."""
    pkg = tmp_path / "conveyor"
    for sub in ("store", "broker", "api"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "store" / "jobs.py").write_text(
        'JOB_GET = "SELECT id FROM __schema__.jobs WHERE id = $1"\n\n\n'
        "async def job_get(conn, sql, i):\n    return await conn.fetchrow(sql, i)\n"
    )
    (pkg / "broker" / "publish.py").write_text("import aio_pika\nfrom aiormq import exceptions\n")
    (pkg / "api" / "routes.py").write_text(
        '"""Reads a job: SELECT ... FROM jobs in the store, never here."""\n\n'
        'import logging\n\nMESSAGE = "select a job type from the list"\n'
        'logging.getLogger("aio_pika").setLevel(logging.WARNING)\n'
    )
    return pkg


def test_a_clean_tree_passes(tree: Path) -> None:
    assert sql_outside_store(tree) == []
    assert broker_imports_outside_broker(tree) == []
    assert imports_outside(tree, DATABASE_LIBS, "store") == []
    assert layer_violations(tree) == []
    assert import_cycles(tree) == []
    assert import_graph(tree)[1] == []


@pytest.mark.parametrize(
    "planted",
    [
        'async def ping(conn):\n    await conn.fetchval("SELECT 1")\n',
        "async def ping(conn, q):\n    await conn.execute(q)\n",
        'Q = "DELETE FROM jobs WHERE id = $1"\n',
        'def q(schema):\n    return f"UPDATE {schema}.jobs SET status = $1"\n',
        'Q = """\nWITH x AS (SELECT id\n  FROM jobs)\nSELECT * FROM x"""\n',
        "Q = 'INSERT INTO job_outbox (job_id) VALUES ($1)'\n",
    ],
)
def test_sql_outside_the_store_is_found(tree: Path, planted: str) -> None:
    (tree / "api" / "planted.py").write_text(planted)
    found = sql_outside_store(tree)
    assert len(found) >= 1 and all("api/planted.py" in f for f in found), found


@pytest.mark.parametrize(
    "planted",
    [
        "import aio_pika\n",
        "from aio_pika.abc import AbstractChannel\n",
        "import aiormq.exceptions\n",
        "from pamqp import commands\n",
        'import importlib\nm = importlib.import_module("aio_pika")\n',
        'm = __import__("aiormq")\n',
    ],
)
def test_aio_pika_outside_the_broker_is_found(tree: Path, planted: str) -> None:
    (tree / "api" / "planted.py").write_text(planted)
    assert any("api/planted.py" in f for f in broker_imports_outside_broker(tree))


@pytest.mark.parametrize(
    "planted",
    [
        ("api/a.py", "from . import b\n", "api/b.py", "from .a import X\n"),
        ("api/a.py", "def f():\n    from .b import Y\n", "api/b.py", "from . import a\n"),
        ("api/a.py", "import conveyor.store.jobs\n", "store/jobs.py", "from ..api import a\n"),
    ],
)
def test_an_import_cycle_is_found(tree: Path, planted: tuple[str, str, str, str]) -> None:
    first, first_text, second, second_text = planted
    (tree / first).write_text(first_text)
    (tree / second).write_text(second_text)
    assert len(import_cycles(tree)) == 1


def test_a_private_import_is_found(tree: Path) -> None:
    (tree / "api" / "a.py").write_text("_SECRET = 1\n")
    (tree / "api" / "b.py").write_text("from .a import _SECRET\n")
    assert import_graph(tree)[1] == ["conveyor/api/b.py:1 imports conveyor.api.a._SECRET"]


def test_the_root_modules_are_counted(tree: Path) -> None:
    for n in range(MAX_ROOT_MODULES + 1):
        (tree / f"m{n}.py").write_text("")
    assert len(root_modules(tree)) == MAX_ROOT_MODULES + 1


def test_asyncpg_outside_the_store_is_found(tree: Path) -> None:
    (tree / "api" / "planted.py").write_text("import asyncpg\n")
    assert imports_outside(tree, DATABASE_LIBS, "store") == [
        "conveyor/api/planted.py:1 imports asyncpg"
    ]


@pytest.mark.parametrize(
    ("where", "text", "found"),
    [
        ("store/up.py", "from ..api import routes\n", "conveyor.store.up -> conveyor.api.routes"),
        (
            "broker/side.py",
            "from ..store import jobs\n",
            "conveyor.broker.side -> conveyor.store.jobs",
        ),
        ("nowhere/x.py", "from ..store import jobs\n", "conveyor.nowhere.x -> conveyor.store.jobs"),
    ],
)
def test_an_import_up_or_across_the_layers_is_found(
    tree: Path, where: str, text: str, found: str
) -> None:
    (tree / "nowhere").mkdir()
    (tree / "nowhere" / "__init__.py").write_text("")
    (tree / where).write_text(text)
    assert layer_violations(tree) == [found]
