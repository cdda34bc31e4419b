from __future__ import annotations

import os
import pickle
import random
import uuid

import pytest

from conveyor.core.errors import InvalidJob
from conveyor.core.jobs import (
    PEN_LADDER,
    TRANSITIONS,
    Status,
    backoff_delay,
    check_type,
    new_job_id,
    parse_priority,
    pen_name_suffix,
    snap_to_pen,
)


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, 5), ("high", 9), ("normal", 5), ("low", 1), (0, 0), (9, 9), (7, 7)],
)
def test_priority_names_and_numbers(given: int | str | None, expected: int) -> None:
    assert parse_priority(given) == expected


@pytest.mark.parametrize("bad", [10, -1, "urgent", True, 5.0, "9"])
def test_bad_priorities_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidJob):
        parse_priority(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("good", ["a", "send_email", "billing.invoice-v2", "A" * 100, "9lives"])
def test_valid_type_names(good: str) -> None:
    assert check_type(good) == good


@pytest.mark.parametrize("bad", ["", "_x", "-x", "a b", "a/b", "a#", "é", "A" * 101, "x\n"])
def test_invalid_type_names(bad: str) -> None:
    with pytest.raises(InvalidJob):
        check_type(bad)


def test_job_ids_are_uuid7_and_time_ordered() -> None:
    ids = [new_job_id() for _ in range(2000)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert len(set(ids)) == len(ids)
    ms = [i.int >> 80 for i in ids]
    assert ms == sorted(ms)


def test_job_ids_match_uuid_and_a_forked_child_never_repeats_its_parents_bits() -> None:
    job_id = new_job_id()  # fills this thread's pool of random bits
    assert job_id == uuid.UUID(str(job_id)) and hash(job_id) == hash(uuid.UUID(int=job_id.int))
    assert pickle.loads(pickle.dumps(job_id)) == job_id
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then exit at once
        os.write(write, new_job_id().bytes)
        os._exit(0)
    os.close(write)
    child = uuid.UUID(bytes=os.read(read, 16))
    os.close(read)
    os.waitpid(pid, 0)
    mask = (1 << 74) - 1  # the random bits (rand_a, rand_b) without version and variant
    ours = new_job_id()  # what the pool held next: the child must not have handed it out
    assert (child.int & mask) != (ours.int & mask)


def test_configured_retry_delays_are_used_in_order_and_the_last_repeats() -> None:
    delays = [5, 30, 300]
    assert [backoff_delay(n, delays) for n in range(1, 6)] == [5, 30, 300, 300, 300]


def test_default_backoff_grows_with_jitter_and_lands_on_pens() -> None:
    rng = random.Random(7)
    for n in range(1, 15):
        values = {backoff_delay(n, rng=rng) for _ in range(200)}
        ceiling = min(2**n, 3600)
        assert all(v in PEN_LADDER for v in values)
        assert all(ceiling / 2 <= v <= snap_to_pen(ceiling) for v in values)
    assert len({backoff_delay(8, rng=rng) for _ in range(200)}) > 1  # jitter spreads retries
    assert backoff_delay(30, rng=rng) <= 3600


def test_snap_and_pen_names() -> None:
    assert snap_to_pen(0) == 0
    assert snap_to_pen(0.2) == 1
    assert snap_to_pen(4) == 5
    assert snap_to_pen(10**9) == PEN_LADDER[-1]
    assert [pen_name_suffix(d) for d in (5, 90, 300, 3600, 5400)] == [
        "5s",
        "90s",
        "5m",
        "1h",
        "90m",
    ]


def test_every_status_has_transitions_and_terminal_ones_only_redrive() -> None:
    assert set(TRANSITIONS) == set(Status)
    assert TRANSITIONS[Status.COMPLETED] == frozenset()
    # a redriven workflow job whose dependencies are unmet waits for them, a limited type's for
    # admission (WAITING); an ordered type's failed head is cancelled to let its key go on
    assert TRANSITIONS[Status.FAILED] == {Status.PENDING, Status.WAITING, Status.CANCELLED}
