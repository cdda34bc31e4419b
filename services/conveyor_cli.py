"""The ``conveyor`` script's entry point, outside the ``conveyor`` package: importing the package
and its commands takes a second or more, and a Ctrl-C in that time must end the command quietly
(exit 130, as ``conveyor.cli.support.guarded`` does once a command runs), not print the import's
``KeyboardInterrupt`` traceback, and never be lost (an import that catches ``BaseException``
would swallow the exception and the command would start anyway). So while the package imports,
SIGINT ends the process at once; then the previous handler is back for the command."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def _quit(signum: int, frame: FrameType | None) -> None:
    os._exit(128 + signum)


def main() -> int:
    previous = signal.signal(signal.SIGINT, _quit)
    try:
        from conveyor.cli.main import main as run
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        return run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
