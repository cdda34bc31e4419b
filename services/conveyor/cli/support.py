"""What the operator commands share: one line instead of a traceback when PostgreSQL or RabbitMQ
cannot be used (``CliError``, ``database``, ``check_broker``, ``run``), a quiet exit when the
reader of stdout goes away (``conveyor jobs list | head -1``), JSON Lines and text output, the
keyset walk of the ``list`` commands, and the confirmation before a bulk change."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from datetime import UTC
from typing import Any, TextIO, TypeVar

import orjson

from ..api.resource import R, decode_cursor, keyset_page
from ..broker import LIBRARY_LOGGERS
from ..core.config import Settings
from ..core.logging import say
from ..core.secrets import mask_url
from ..store import Store, for_schema
from ..store.bounds import API_STATEMENT_FLOOR, SessionBounds
from ..store.connect import (
    create_pool,
    database_name,
    is_missing_database,
    is_refused_login,
    is_unavailable,
    is_unmigrated,
)

EXIT_PIPE = 141  # 128 + SIGPIPE, as a process killed by it (`set -o pipefail` sees this)
T = TypeVar("T")


class CliError(Exception):
    """A failure told in one line on stderr, never a traceback; the exit code is ``code`` (2:
    the command was used wrongly or cannot reach what it needs; 1: it ran and failed)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def job_id(text: str) -> uuid.UUID:
    """A job id from the command line, or a ``CliError`` in the user's words."""
    try:
        return uuid.UUID(text)
    except ValueError:
        raise CliError(
            f'"{text}" is not a job id (a UUID, as `conveyor jobs list` prints them)'
        ) from None


def list_by_default(
    group: argparse.ArgumentParser, actions: Any, listing: argparse.ArgumentParser
) -> None:
    """``conveyor <group>`` alone runs ``<group> list`` (``listing``) with its defaults. Call it
    after ``group.add_subparsers`` (``actions``)."""
    actions.required = False
    group.epilog = "Without an ACTION: list."
    group.set_defaults(action="list", **vars(listing.parse_args([])))


def when(value: Any) -> str:
    """A time for human output: UTC, with its zone."""
    return "-" if value is None else f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def shown(value: Any) -> str:
    """A value for human output: ``-`` for none, ``yes``/``no`` for a flag, never a repr."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def database_error(exc: BaseException, settings: Settings) -> CliError | None:
    """The one line for an error that means the database cannot be used (None: another error)."""
    url = mask_url(settings.database_url)
    if is_missing_database(exc):
        name = database_name(settings.database_url)
        return CliError(f"database {name!r} does not exist ({url}): run `conveyor migrate`")
    if is_unmigrated(exc):
        return CliError(
            f"database schema {settings.db_schema!r} is not migrated ({url}): "
            "run `conveyor migrate`"
        )
    if is_unavailable(exc) or is_refused_login(exc):
        return CliError(f"cannot use PostgreSQL at {url}: {type(exc).__name__}: {exc}"[:400])
    return None


@contextlib.asynccontextmanager
async def database(
    settings: Settings, name: str = "conveyor-cli"
) -> AsyncIterator[tuple[Store, Any]]:
    """The store and one connection for an operator command; a database that cannot be
    reached, does not exist or is not migrated becomes a ``CliError``.

    The connection carries the components' session bounds (``store/bounds.py``): a command
    paused inside its transaction (Ctrl-Z, a frozen host) between ``cancel_workflow`` and its
    COMMIT holds every open job of the workflow, and the workers' completions and heartbeats
    wait on those rows; PostgreSQL ends that session after the idle bound, which rolls the
    command back (it then fails with one line). Its statements keep the API's long bound: an
    operator's bulk statement may run as long as the API's batch insert."""
    try:
        bounds = SessionBounds.of(settings, statement_floor=API_STATEMENT_FLOOR)
        pool = await create_pool(
            settings.database_url,
            application_name=name,
            max_size=1,
            pooler=settings.db_pooler,
            bounds=bounds,
        )
        try:
            async with pool.acquire() as conn:
                yield for_schema(settings.db_schema), conn
        finally:
            await pool.close()
    except (CliError, BrokenPipeError):  # stdout's reader left: not the database's doing
        raise
    except Exception as exc:
        error = database_error(exc, settings)
        if error is None:
            raise
        raise error from exc


def run(
    main: Coroutine[Any, Any, T],
    usage: tuple[type[Exception], ...] = (ValueError,),
    *,
    named: bool = False,
    failed: bool = False,
) -> T:
    """Run a command's coroutine. An error in ``usage`` (the command's input is wrong) is a
    ``CliError`` (exit 2), preceded by its type's name when ``named``; with ``failed``, any
    other error is one line naming its type, exit 1."""
    try:
        return asyncio.run(main)
    except (CliError, BrokenPipeError):
        raise
    except usage as exc:
        raise CliError(f"{type(exc).__name__}: {exc}" if named else str(exc)) from None
    except Exception as exc:
        if not failed:
            raise
        raise CliError(f"{type(exc).__name__}: {exc}", code=1) from None


async def check_broker(settings: Settings) -> None:
    """``CliError`` when RabbitMQ cannot be reached."""
    from ..broker.cluster import BrokerRefused, reachable  # aio-pika: only where it is used

    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:  # the client logs the refused connection itself: the one line is ours
        lg.setLevel(logging.CRITICAL)
    try:
        await reachable(settings.amqp_url, timeout=5)
    except Exception as exc:
        url = mask_url(settings.amqp_url)
        if isinstance(exc, BrokerRefused) and exc.authentication:
            text = f"{exc}. Check the user and password in CONVEYOR_AMQP_URL ({url})."
        elif isinstance(exc, BrokerRefused):  # it names the node, the user and the cause
            text = f"cannot reach RabbitMQ at {url}: {exc}"
        else:
            text = f"cannot reach RabbitMQ at {url}: {type(exc).__name__}: {exc}"
        raise CliError(text[:400]) from exc
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def guarded(run: Callable[[], int], command: str) -> int:
    """Run a command: a ``CliError`` is one line and exit 2; a reader that closed the pipe ends
    the command quietly (exit 141, like ``yes | head``); Ctrl-C is exit 130."""
    try:
        code = run()
        sys.stdout.flush()  # a closed pipe shows here when the output fit in the buffer
        return code
    except CliError as exc:
        say(f"conveyor {command}: {exc}", level=logging.ERROR)  # JSON in the json log format
        return exc.code
    except BrokenPipeError:
        # the reader is gone: send what Python still holds for stdout to /dev/null, so the
        # interpreter's final flush does not print "Exception ignored ... BrokenPipeError"
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE
    except KeyboardInterrupt:
        return 130


def json_line(data: Any) -> None:
    """One JSON object on one line (JSON Lines: `| jq`, `| head` and `grep` work)."""
    sys.stdout.write(json_text(data) + "\n")


def listing(
    items: Iterable[T], as_json: bool, record: Callable[[T], Any], line: Callable[[T], str]
) -> None:
    """Each item as one JSON object per line (``--json``: ``record``) or one text ``line``."""
    for item in items:
        sys.stdout.write((json_text(record(item)) if as_json else line(item)) + "\n")


async def pages(
    args: argparse.Namespace,
    fetch: Callable[[uuid.UUID | None, int], Awaitable[list[R]]],
    record: Callable[[R], Any],
    line: Callable[[R], str],
) -> int:
    """A ``list`` command's keyset walk: ``fetch(after, n)`` reads ``n`` rows after a row id,
    newest first; each page of ``args.limit`` is printed (``listing``), then the next page's
    ``--cursor`` on stderr, or with ``args.all`` the next page. A malformed ``args.cursor``
    raises ``InvalidJob`` (a ``ValueError``)."""
    if args.limit < 1:
        raise CliError("--limit must be at least 1")
    after = decode_cursor(args.cursor) if args.cursor else None
    while True:
        rows, cursor = keyset_page(await fetch(after, args.limit + 1), args.limit)
        listing(rows, args.json, record, line)
        if cursor is None:
            return 0
        if not args.all:
            print(f"more: --cursor {cursor}", file=sys.stderr)
            return 0
        sys.stdout.flush()  # a page at a time: `| head` stops the walk early
        after = rows[-1].id


def json_text(data: Any) -> str:
    return orjson.dumps(data, default=str).decode()


def json_doc(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")


def confirm(question: str, *, yes: bool, stdin: TextIO | None = None) -> bool:
    """``--yes``, or a "y" typed at a terminal. Without a terminal and without ``--yes`` a bulk
    change is refused (``CliError``): a script must say so explicitly."""
    if yes:
        return True
    stdin = stdin if stdin is not None else sys.stdin
    if not stdin.isatty():
        raise CliError(f"{question} Refused: stdin is not a terminal; pass --yes to confirm")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return stdin.readline().strip().lower() in ("y", "yes")
