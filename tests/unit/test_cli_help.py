"""``--help`` explains every option and argument of every ``conveyor`` command: one without a
help line shows only its name, and a new user has to guess (``--host``, ``--catch-up``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from conveyor.cli.main import build_parser


def _undocumented(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
    for action in parser._actions:  # argparse lists its actions only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _undocumented(sub, f"{path} {name}")
        elif not action.help:
            yield f"{path} {'/'.join(action.option_strings) or action.dest}"


def test_every_option_and_argument_has_help() -> None:
    assert list(_undocumented(build_parser(), "conveyor")) == []
