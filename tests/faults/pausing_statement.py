"""A ``conveyor`` process that freezes itself inside a transaction, just after a given store
statement ran: ``python -m tests.faults.pausing_statement FLAG STATEMENT -- ARGS...`` runs
``conveyor ARGS...`` (a worker, ``workflows cancel``, ...) with ``Store.STATEMENT`` wrapped from
outside, in this process only.

FLAG is a file. While it exists, the first call of the statement that runs inside a transaction
and whose arguments name an id listed in FLAG (one per line; an empty FLAG matches any call)
deletes FLAG, writes ``pausing_statement: frozen <statement> pid=<pid>`` to stderr and sends
the process SIGSTOP: frozen, like a VM pause or a long GC, with the statement's row locks held
and its transaction open (``idle in transaction``). The test sends SIGCONT. A statement run
alone, outside a transaction, commits before its client sees the answer: a freeze there holds
no lock, so it is not a case of this fault.

- ``job_complete_many`` in a worker: a completion batch written beside a follow-up (or a
  progress report, or failures), whose workflow trigger counted down and locked the released
  child's row;
- ``workflow_cancel`` in ``conveyor workflows cancel``: every open job of the workflow locked."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conveyor import cli
from conveyor.store import Store


def say(text: str) -> None:
    sys.stderr.write(f"pausing_statement: {text}\n")
    sys.stderr.flush()


def _ids(value: Any) -> Iterator[str]:
    """Every uuid in an argument: itself, in a sequence, or a dataclass's ``job_id``."""
    if isinstance(value, uuid.UUID):
        yield str(value)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _ids(v)
    elif isinstance(getattr(value, "job_id", None), uuid.UUID):
        yield str(value.job_id)


def _take(flag: Path, args: tuple[Any, ...]) -> bool:
    """True once: FLAG exists and names one of the ids in ``args`` (or nothing); it is
    deleted (of several processes sharing FLAG, only one deletes it)."""
    try:
        wanted = set(flag.read_text().split())
    except FileNotFoundError:
        return False
    if wanted and not wanted & set(_ids(args)):
        return False
    try:
        flag.unlink()
    except FileNotFoundError:
        return False
    return True


def main(flag: Path, statement: str, argv: list[str]) -> int:
    original = getattr(Store, statement)

    async def pausing(self: Store, conn: Any, *args: Any, **kw: Any) -> Any:
        out = await original(self, conn, *args, **kw)
        if conn.is_in_transaction() and _take(flag, args):
            say(f"frozen {statement} pid={os.getpid()}")
            os.kill(os.getpid(), signal.SIGSTOP)
            say("resumed")
        return out

    setattr(Store, statement, pausing)
    return cli.main(argv)


if __name__ == "__main__":
    sep = sys.argv.index("--")
    sys.exit(main(Path(sys.argv[1]), sys.argv[2], sys.argv[sep + 1 :]))
