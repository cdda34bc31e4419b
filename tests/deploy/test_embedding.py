"""Conveyor as a dependency of someone else's project: the built wheel carries ``py.typed`` and
the migrations, and ``mypy --strict`` accepts an application's handlers written against the
*installed* package (not the source tree, which mypy would treat as untyped-but-present code)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

APP = textwrap.dedent(
    """
    from __future__ import annotations

    from conveyor import Job, JobRouter, Retry

    router = JobRouter()


    @router.job("send_email", max_retries=5, retry_delays=[5, 30], timeout=30)
    async def send_email(job: Job) -> dict[str, object]:
        if job.attempt > 3:
            raise Retry(delay=5)
        return {"to": job.payload.get("to"), "attempt": job.attempt}


    @router.job("resize")
    def resize(job: Job) -> None:
        print(job.id, job.type, job.priority)
    """
)

# A deliberate type error: proves mypy really sees Conveyor's annotations (with an untyped
# package it would accept this silently).
BROKEN = APP + "\nwrong: str = router.job('x', max_retries=1)\n"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    (found,) = out.glob("conveyor-*.whl")
    return found


def test_wheel_carries_py_typed_and_migrations(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "conveyor/py.typed" in names
    assert any(n.startswith("conveyor/_migrations/versions/") for n in names)


@pytest.fixture(scope="module")
def app_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding only the wheel; the test venv's site-packages supply the
    dependencies through a .pth line (so nothing is downloaded)."""
    venv = tmp_path_factory.mktemp("appenv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "deps.pth").write_text("\n".join(deps) + "\n")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return py


def _mypy(py: Path, source: str, where: Path) -> subprocess.CompletedProcess[str]:
    app = where / "shop_jobs.py"
    app.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--python-executable", str(py), str(app)],
        capture_output=True, text=True, cwd=where, timeout=300,
    )  # fmt: skip


@pytest.mark.timeout(300)  # two cold mypy --strict runs over the dependencies: CPU-bound
def test_mypy_strict_accepts_an_applications_handlers(app_env: Path, tmp_path: Path) -> None:
    ok = _mypy(app_env, APP, tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _mypy(app_env, BROKEN, tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Incompatible types in assignment" in bad.stdout, bad.stdout
