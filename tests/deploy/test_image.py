"""deploy/Dockerfile, .dockerignore and deploy/healthcheck.py (the image's probe helper)."""

from __future__ import annotations

import http.server
import importlib.util
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from .checks import ROOT
from .container_checks import (
    DOCKERFILE,
    DOCKERIGNORE,
    copy_sources,
    dockerfile_problems,
    dockerignore_excludes,
    parse_dockerfile,
)

HEALTHCHECK = ROOT / "deploy" / "healthcheck.py"


def test_dockerfile_is_multi_stage_non_root_and_runs_conveyor() -> None:
    assert dockerfile_problems(DOCKERFILE.read_text()) == []


def test_the_final_stage_user_is_numeric_and_not_root() -> None:
    final = parse_dockerfile(DOCKERFILE.read_text())[-1]
    (user,) = final.all("USER")
    assert user == "10001:10001"


def without_line(text: str, startswith: str) -> str:
    lines = text.splitlines()
    kept = [line for line in lines if not line.startswith(startswith)]
    assert len(kept) < len(lines)
    return "\n".join(kept)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: without_line(t, "USER"), "sets no USER"),
        (lambda t: t.replace("USER 10001:10001", "USER root"), "numeric non-root UID"),
        (lambda t: t.replace("USER 10001:10001", "USER 0"), "numeric non-root UID"),
        (lambda t: t.replace('ENTRYPOINT ["conveyor"]', "ENTRYPOINT conveyor"), "ENTRYPOINT"),
        (lambda t: t.replace("python:3.11-slim AS runtime", "python:3.11 AS runtime"), "slim"),
        (lambda t: t.replace("pip wheel", "pip install"), "does not build wheels"),
        (lambda t: without_line(t, "COPY examples/"), "does not copy examples/"),
    ],
    ids=["no-user", "root-by-name", "root-by-uid", "shell-entrypoint", "fat-base", "no-wheel",
         "no-examples"],
)  # fmt: skip
def test_a_broken_dockerfile_is_rejected(edit: Callable[[str], str], expected: str) -> None:
    problems = dockerfile_problems(edit(DOCKERFILE.read_text()))
    assert any(expected in p for p in problems), problems


def test_a_single_stage_dockerfile_is_rejected() -> None:
    text = "FROM python:3.11-slim\nCOPY . /app\nRUN pip install /app\nUSER 10001\n"
    assert dockerfile_problems(text) == [
        "a multi-stage build needs a builder stage and a final stage"
    ]


# ---------------------------------------------------------------------------- build context


def test_everything_the_dockerfile_copies_exists_and_is_in_the_build_context() -> None:
    ignore = DOCKERIGNORE.read_text()
    sources = copy_sources(parse_dockerfile(DOCKERFILE.read_text()))
    assert {"pyproject.toml", "services/", "migrations/", "examples/"} <= set(sources)
    for source in sources:
        path = ROOT / source
        assert path.exists(), source
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for f in files:
            relative = f.relative_to(ROOT).as_posix()
            if "__pycache__" not in relative:
                assert not dockerignore_excludes(ignore, relative), relative


@pytest.mark.parametrize(
    "path",
    [
        ".env",
        ".git/config",
        ".venv/bin/python",
        "tests/conftest.py",
        "services/x/__pycache__/a.pyc",
    ],
)
def test_secrets_caches_and_history_stay_out_of_the_build_context(path: str) -> None:
    assert dockerignore_excludes(DOCKERIGNORE.read_text(), path)


def test_dockerignore_rules_follow_docker_semantics() -> None:
    rules = "*\n!services/\n**/__pycache__\n!keep/**/*.txt\n"
    assert dockerignore_excludes(rules, "README.md")
    assert not dockerignore_excludes(rules, "services/conveyor/cli/main.py")
    assert dockerignore_excludes(rules, "services/conveyor/cli/__pycache__/main.pyc")
    assert not dockerignore_excludes(rules, "keep/a/b/c.txt")


# ---------------------------------------------------------------------------- healthcheck.py


@pytest.fixture(scope="module")
def healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conveyor_deploy_healthcheck", HEALTHCHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 10001
   1: 0A000005:A1B2 0A00000A:1628 01 00000000:00000000 00:00000000 00000000 10001
   2: 0A000005:A1B3 0A00000B:1538 06 00000000:00000000 00:00000000 00000000 10001
"""


def test_the_connection_table_yields_established_remote_ports(healthcheck: ModuleType) -> None:
    # listening 8080, established to 5672 (0x1628), TIME_WAIT to 5432 (0x1538)
    assert healthcheck.established_remote_ports([PROC_NET_TCP]) == {5672}
    assert healthcheck.established_remote_ports([PROC_NET_TCP.splitlines()[0]]) == set()


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("amqp://u:p@rabbitmq:5672/", 5672),
        ("amqp://u:p@rabbitmq/", 5672),
        ("amqps://u:p@rabbitmq/vhost", 5671),
        ("amqp://u:p@rabbitmq:5673/", 5673),
    ],
)
def test_the_broker_port_comes_from_the_amqp_url(
    healthcheck: ModuleType, url: str, port: int
) -> None:
    assert healthcheck.amqp_port(url) == port


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_the_http_check_passes_on_2xx_only(healthcheck: ModuleType, server: str) -> None:
    assert healthcheck.main([f"{server}/healthz"]) == 0
    assert healthcheck.main([f"{server}/readyz"]) == 1
    assert healthcheck.main([]) == 2


def test_the_amqp_check_fails_without_a_broker_connection(
    healthcheck: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    table = tmp_path / "tcp"
    table.write_text(PROC_NET_TCP)
    monkeypatch.setattr(healthcheck, "TCP_TABLES", (str(table), str(tmp_path / "missing")))
    monkeypatch.setenv("CONVEYOR_AMQP_URL", "amqp://u:p@rabbitmq:5672/")
    assert healthcheck.main(["--amqp-connected"]) == 0
    monkeypatch.setenv("CONVEYOR_AMQP_URL", "amqp://u:p@rabbitmq:5673/")
    assert healthcheck.main(["--amqp-connected"]) == 1
