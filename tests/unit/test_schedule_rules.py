"""Schedule rules and the ticks a sweeper pass enqueues (pure: no clock, no database), including
daylight-saving changes in America/New_York and Europe/Berlin."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from conveyor.jobs.schedules import InvalidSchedule, Rule, plan
from conveyor.maintenance.schedules import Watch

NY = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def run_day(rule: Rule, start: datetime, hours: int, step: float = 30.0) -> list[datetime]:
    """Every tick a sweeper passing every ``step`` seconds enqueues over ``hours``."""
    start = start.astimezone(UTC)  # real time: wall-clock arithmetic would skip or repeat
    next_run = rule.next_after(start)
    out: list[datetime] = []
    now = start
    while now < start + timedelta(hours=hours):
        now += timedelta(seconds=step)
        p = plan(rule, next_run, now, grace=60, catch_up="skip")
        out.extend(p.ticks)
        next_run = p.next_run_at
    return out


@pytest.mark.parametrize(
    ("zone", "day", "expected_utc"),
    [
        # spring forward, 2:00 → 3:00 local: 02:30 does not exist and runs once, at 03:00
        (NY, (2026, 3, 8), [utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)]),
        (BERLIN, (2026, 3, 29),
         [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]),
    ],
)  # fmt: skip
def test_a_tick_in_the_skipped_hour_runs_once(
    zone: ZoneInfo, day: tuple[int, int, int], expected_utc: list[datetime]
) -> None:
    rule = Rule(cron="30 2 * * *", timezone=str(zone))
    start = datetime(*day, tzinfo=zone) - timedelta(days=1)
    assert run_day(rule, start, 72) == expected_utc


@pytest.mark.parametrize(
    ("zone", "day", "offset_before"),
    [(NY, (2026, 11, 1), 4), (BERLIN, (2026, 10, 25), -2)],
)
def test_a_repeated_hour_runs_a_fixed_time_once(
    zone: ZoneInfo, day: tuple[int, int, int], offset_before: int
) -> None:
    # 01:30 (New York) / 02:30 (Berlin) happen twice on the fall-back night: one job
    hour = 1 if zone is NY else 2
    rule = Rule(cron=f"30 {hour} * * *", timezone=str(zone))
    start = datetime(*day, tzinfo=zone) - timedelta(hours=2)
    ticks = run_day(rule, start, 24)
    assert len(ticks) == 1
    assert ticks[0] == datetime(*day, hour, 30, tzinfo=UTC) + timedelta(hours=offset_before)


def test_hourly_ticks_follow_real_time_across_both_changes() -> None:
    rule = Rule(cron="0 * * * *", timezone="America/New_York")
    spring = run_day(rule, datetime(2026, 3, 8, 0, 0, tzinfo=NY), 5)
    # 01:00 EST, then 03:00 EDT: the missing 02:00 hour has no tick of its own
    assert [t.astimezone(NY).hour for t in spring] == [1, 3, 4, 5, 6]
    fall = run_day(rule, datetime(2026, 11, 1, 0, 0, tzinfo=NY), 5)
    # 01:00 EDT and 01:00 EST are an hour apart in real time: both run, each once
    assert [t.astimezone(NY).hour for t in fall] == [1, 1, 2, 3, 4]
    assert len(set(fall)) == len(fall)


def test_every_ticks_are_epoch_aligned_and_each_runs_once() -> None:
    rule = Rule(every=5)
    start = utc(2030, 1, 1, 0, 0, 2)
    assert rule.next_after(start) == utc(2030, 1, 1, 0, 0, 5)
    ticks = run_day(rule, start, 1, step=0.7)
    assert len(ticks) == len(set(ticks)) == 720
    assert all(t.second % 5 == 0 and t.microsecond == 0 for t in ticks)


def test_missed_ticks_are_skipped_or_the_last_one_runs() -> None:
    rule = Rule(cron="*/5 * * * *")
    next_run = utc(2030, 1, 1, 10, 0)
    now = utc(2030, 1, 1, 12, 2)  # two hours without a sweeper
    skip = plan(rule, next_run, now, grace=60, catch_up="skip")
    assert skip.ticks == [] and skip.missed == 25 and skip.next_run_at == utc(2030, 1, 1, 12, 5)
    last = plan(rule, next_run, now, grace=60, catch_up="last")
    assert last.ticks == [utc(2030, 1, 1, 12, 0)] and last.missed == 24
    # a tick within the grace runs as usual; the older ones are still missed
    late = plan(rule, next_run, utc(2030, 1, 1, 12, 0, 30), grace=60, catch_up="last")
    assert late.ticks == [utc(2030, 1, 1, 12, 0)]
    # not yet due
    early = plan(rule, next_run, utc(2030, 1, 1, 9, 59), grace=60, catch_up="skip")
    assert early.ticks == [] and early.next_run_at == next_run


def test_ticks_a_running_sweeper_saw_come_are_late_not_missed() -> None:
    """A peer paused inside the schedules transaction held the schedule; the sweeper that takes
    it over has been passing all along (``watched_since``): the ticks it saw come all run."""
    rule = Rule(every=1)
    next_run = utc(2030, 1, 1, 10, 0, 0)
    now = utc(2030, 1, 1, 10, 0, 20)
    held = plan(rule, next_run, now, grace=5, catch_up="skip", watched_since=next_run)
    assert held.ticks == [next_run + timedelta(seconds=k) for k in range(21)]
    assert held.missed == 0 and held.next_run_at == utc(2030, 1, 1, 10, 0, 21)
    # watching since a moment after the ticks began: the ones older than the grace then missed
    later = plan(rule, next_run, now, grace=5, catch_up="skip",
                 watched_since=utc(2030, 1, 1, 10, 0, 10))  # fmt: skip
    assert later.ticks[0] == utc(2030, 1, 1, 10, 0, 5) and later.missed == 5
    # a watch that starts now changes nothing
    assert plan(rule, next_run, now, grace=5, catch_up="skip", watched_since=now) == plan(
        rule, next_run, now, grace=5, catch_up="skip"
    )


def test_a_watch_restarts_after_a_gap_longer_than_the_grace() -> None:
    watch = Watch()
    t = utc(2030, 1, 1, 10, 0, 0)
    assert watch.start(t, 5) == t
    watch.passed(t)
    for k in range(1, 40):  # a pass every 0.5 s
        at = t + timedelta(seconds=k / 2)
        assert watch.start(at, 5) == t
        watch.passed(at)
    resumed = t + timedelta(seconds=19.5 + 6)  # this sweeper was frozen (or down) 6 s
    assert watch.start(resumed, 5) == resumed


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cron": "* * * *"},
        {"cron": "61 * * * *"},
        {"cron": "* * * * * *"},
        {"cron": "0 0 30 2 *"},  # never
        {"cron": "not cron"},
        {"cron": "0 * * * *", "timezone": "Mars/Olympus"},
        {"cron": "0 * * * *", "timezone": "../etc/passwd"},
        {"every": 0.5},
        {"every": float("nan")},
        {"cron": "0 * * * *", "every": 60},
        {},
    ],
)
def test_invalid_rules(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidSchedule):
        Rule(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["nightly\n", "nightly\r\n", "\nnightly", "night ly", ""])
def test_a_schedule_name_is_matched_whole(name: str) -> None:
    """No trailing newline gets through (``re.match`` with ``$`` would let one; the CLI and a
    handler's ``schedule=`` take this path): it would make a schedule that neither the API nor
    the dashboard's buttons could address."""
    from conveyor.jobs.schedules import build_schedule

    with pytest.raises(InvalidSchedule):
        build_schedule(name, job_type="t", every_seconds=60)
    assert build_schedule("nightly", job_type="t", every_seconds=60).name == "nightly"


def test_a_schema_name_is_matched_whole() -> None:
    """The same ``$`` slip in ``check_schema`` (schema and role names go into SQL unquoted)."""
    from conveyor.store.registry import check_schema

    with pytest.raises(ValueError):
        check_schema("conveyor\n")
    assert check_schema("conveyor") == "conveyor"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_schedule_payload_with_a_non_finite_number_is_refused(value: float) -> None:
    """Every tick would otherwise enqueue ``null`` where the number was (orjson's encoding)."""
    from conveyor.jobs.schedules import build_schedule

    with pytest.raises(InvalidSchedule, match=r"numbers must be finite \(.* at payload\.x\[0\]\)"):
        build_schedule("n", job_type="t", every_seconds=60, payload={"x": [value]})
    row = build_schedule("n", job_type="t", every_seconds=60, payload={"x": [None]})
    assert row.payload_json == '{"x":[null]}'


@pytest.mark.parametrize("value", [1e16, 1e20, 1e300, -4.324448394381094e16])
def test_a_schedule_payload_is_encoded_as_an_enqueued_one(value: float) -> None:
    """A float of 1e16 and above is written fixed-point (jsonb would read ``1e+20`` back as an
    integer): the schedule's payload, and so every tick's job, keeps it a float, as ``enqueue``
    does."""
    from conveyor.jobs.schedules import build_schedule
    from conveyor.jobs.spec import JobSpec, build_job

    payload = {"x": value, "nested": [{"y": value}]}
    row = build_schedule("n", job_type="t", every_seconds=60, payload=payload)
    assert row.payload_json == build_job(JobSpec("t", payload)).payload_json
    assert "e+" not in row.payload_json
