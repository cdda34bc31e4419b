"""Telling one job's failure from everyone's, and the waits of the jobs set aside."""

from __future__ import annotations

import uuid

import asyncpg

from conveyor.core.isolate import Aside, bound_passed, concerns_rows

E = asyncpg.exceptions


def test_a_statement_refused_for_its_rows_is_isolated_an_outage_is_not() -> None:
    for rows in (
        E.RaiseError("a trigger's error"),
        E.LockNotAvailableError("lock bound"),
        E.QueryCanceledError("statement bound"),
        E.DeadlockDetectedError("x"),
        E.UntranslatableCharacterError("x"),
        E.UniqueViolationError("x"),
        UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
    ):
        assert concerns_rows(rows), rows
    for whole in (
        ConnectionResetError(),
        TimeoutError(),  # the client's: a slow statement or a half-open connection
        E.ConnectionDoesNotExistError("x"),
        E.InterfaceError("x"),
        E.AdminShutdownError("x"),
        E.CannotConnectNowError("x"),
        E.TooManyConnectionsError("x"),
        E.IdleInTransactionSessionTimeoutError("x"),
        E.InsufficientPrivilegeError("x"),  # the deployment's: every job alike
        E.UndefinedTableError("x"),
        E.InvalidCatalogNameError("x"),
    ):
        assert not concerns_rows(whole), whole


def test_which_bound_a_statement_passed() -> None:
    assert bound_passed(E.LockNotAvailableError("x")) == "lock"
    assert bound_passed(E.QueryCanceledError("x")) == "statement"
    assert bound_passed(E.RaiseError("x")) is None
    assert bound_passed(TimeoutError()) is None


def test_a_job_set_aside_waits_1_s_doubling_to_60_s() -> None:
    now = [0.0]
    aside = Aside(lambda: now[0])
    job, other = uuid.uuid4(), uuid.uuid4()
    assert aside.due() == [] and aside.held() == []
    assert [aside.failed(job) for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert aside.failed(other) == 1
    assert set(aside.held()) == {job, other}
    assert aside.due() == []
    now[0] = 1.0
    assert aside.due() == [other]
    aside.settled(other)
    assert aside.held() == [job] and aside.due() == []
    now[0] = 60.0
    assert aside.due() == [job]
    aside.settled(job)
    aside.settled(job)  # twice: nothing to settle
    assert aside.held() == []
