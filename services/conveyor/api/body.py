"""Request bodies before validation: the byte limit while the body streams in (``BodyLimit``),
a strict JSON parser (``parse_json``) and the batch item count taken before anything is built
(``count_batch_items``).

Why here and not in FastAPI's body handling: FastAPI parses with the standard ``json`` module,
which accepts ``NaN``/``Infinity``, turns ``1e400`` into ``inf`` (stored as ``null``) and builds a
million dicts for a million-item batch before the 1,000-job limit is looked at."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import ijson
import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# A rejected body is still read (and dropped, never stored) up to this many bytes, so a client
# that sends everything before reading gets its 413 instead of a connection reset.
DISCARD_CAP = 1024 * 1024 * 1024

# Integers that survive the round trip PostgreSQL jsonb -> orjson unchanged.
INT_MIN, INT_MAX = -(2**63), 2**64 - 1

# Number literals that orjson may change silently: a negative exponent of three digits or more
# (underflow to 0.0), a run of 300 zeros (the same without an exponent), 19 digits in a row
# (an integer beyond 64 bits becomes a float). Also matches inside strings: a match only asks for
# the exact (slower) check, it rejects nothing by itself. ``SUSPECT`` states the rule; ``suspect``
# decides it (a unit test checks they agree).
SUSPECT = re.compile(rb"[eE]-[0-9]{3}|[0-9]{19}|0{300}")
# ``suspect`` maps every byte onto "9" (a digit), "e" (e or E), "-" or " " (anything else) and
# searches the result with bytes' substring search (C memchr/two-way): "e-999" is
# [eE]-[0-9]{3}, nineteen "9"s are [0-9]{19}, which 0{300} implies. The regex tries its
# alternation at every byte of the body; the substring search is many times faster.
_NUMBER_CHARS = bytes(
    0x39 if 0x30 <= i <= 0x39 else 0x65 if i in (0x45, 0x65) else 0x2D if i == 0x2D else 0x20
    for i in range(256)
)
_EXPONENT, _DIGIT_RUN = b"e-999", b"9" * 19
_WINDOW = 1 << 20  # translated a window at a time: no second copy of a 64 MiB body


def suspect(body: bytes) -> bool:
    """Whether ``SUSPECT`` matches somewhere in ``body``."""
    overlap = len(_DIGIT_RUN) - 1  # a match that straddles two windows is in the second
    for start in range(0, len(body), _WINDOW):
        window = body[start : start + _WINDOW + overlap].translate(_NUMBER_CHARS)
        if _EXPONENT in window or _DIGIT_RUN in window:
            return True
    return False


_NON_FINITE = re.compile(rb"(?<![A-Za-z0-9_\"])-?(?:NaN|Infinity)(?![A-Za-z0-9_\"])")


class BodyError(Exception):
    """A body that cannot become a request: ``status`` 400 (not JSON) or 422 (JSON, but numbers
    or nesting Conveyor refuses), ``error`` the short code of the error model."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail


class TooManyJobs(Exception):
    """A batch holds more items than allowed; raised before any item is validated."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a batch holds at most {limit} jobs")
        self.limit = limit


def parse_json(body: bytes) -> Any:
    """``body`` as JSON, refusing what would not come back unchanged: ``NaN``/``Infinity``,
    numbers that overflow (``1e400``) or underflow (``1e-400``) a double, integers beyond
    64 bits. Raises ``BodyError``."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _classify(body, str(exc)) from None
    if suspect(body):
        _check_numbers(body)
    return data


def _classify(body: bytes, message: str) -> BodyError:
    if "depth limit" in message:
        return BodyError(422, "nesting_too_deep", "JSON nested deeper than 1024 levels")
    if "infinity" in message or _NON_FINITE.search(body):
        return BodyError(
            422, "invalid_number", "numbers must be finite doubles (no NaN, Infinity, 1e400)"
        )
    return BodyError(400, "malformed_json", f"the body is not JSON: {message}")


class _Refused(ValueError):
    pass


def _exact_float(text: str) -> float:
    value = float(text)
    if value == 0.0 and re.search(r"[1-9]", text.lower().partition("e")[0]):
        raise _Refused(f"{text[:40]} underflows to 0.0")
    return value


def _exact_int(text: str) -> int:
    if len(text) > 20:
        raise _Refused(f"{text[:40]}... is outside the 64-bit integer range")
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise _Refused(f"{text} is outside the 64-bit integer range")
    return value


def _check_numbers(body: bytes) -> None:
    """The exact check, only for bodies with a suspect literal: the standard parser hands every
    number's text to a hook. orjson already proved the body is JSON of bounded depth."""
    try:
        json.loads(body, parse_float=_exact_float, parse_int=_exact_int)
    except _Refused as exc:
        raise BodyError(422, "invalid_number", str(exc)) from None


def count_batch_items(body: bytes, limit: int) -> None:
    """Raise ``TooManyJobs`` when ``body['jobs']`` has more than ``limit`` items, reading items
    one at a time (ijson's C parser) and stopping at the first one over: a million-item batch
    costs ``limit`` items, not a million dicts. Malformed bodies are left to ``parse_json``."""
    if len(body) <= PRECHECK_BYTES:
        return  # small enough for the strict parse to count (``batch.build_batch``), bounded
    seen = 0
    try:
        for _ in ijson.items(body, "jobs.item", use_float=True):
            seen += 1
            if seen > limit:
                raise TooManyJobs(limit)
    except TooManyJobs:
        raise
    except Exception:  # any parse error: parse_json reports it precisely
        return


# Once this much of a body has arrived, ``precheck`` looks at it (a batch's item count).
PRECHECK_BYTES = 256 * 1024

Precheck = Callable[[str, bytes], "tuple[int, bytes] | None"]


class BodyLimit:
    """Reads the request body up to a limit before the app sees it: ``413`` for an oversized body,
    whether it announces a Content-Length or arrives chunked. ``precheck(path, prefix)`` sees the
    first ``PRECHECK_BYTES`` and may refuse the request there (``(status, body)``): the rest is
    read and dropped, never stored."""

    def __init__(
        self,
        app: ASGIApp,
        limit_for: Callable[[str], int],
        render: Callable[[int], bytes],
        precheck: Precheck | None = None,
    ) -> None:
        self.app = app
        self.limit_for = limit_for
        self.render = render
        self.precheck = precheck

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await _discard(receive)
                    await self._too_large(send, limit)
                    return
        body = bytearray()
        more = True
        checked = self.precheck is None
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                del body[:]  # drop what was read before reading the rest
                if more:
                    await _discard(receive)
                await self._too_large(send, limit)
                return
            if not checked and (len(body) >= PRECHECK_BYTES or not more):
                checked = True
                assert self.precheck is not None
                refusal = self.precheck(scope["path"], bytes(body))
                if refusal is not None:
                    del body[:]
                    if more:
                        await _discard(receive)
                    await _answer(send, *refusal)
                    return
        whole = bytes(body)
        del body
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send, limit: int) -> None:
        await _answer(send, 413, self.render(limit))


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _discard(receive: Receive, cap: int = DISCARD_CAP) -> None:
    """Read and drop the rest of a rejected body (up to ``cap`` bytes)."""
    seen = 0
    while seen <= cap:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return
