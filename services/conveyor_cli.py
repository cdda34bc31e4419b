"""The ``conveyor`` script's entry point, outside the ``conveyor`` package: importing the package
and its commands takes a second or more, and a Ctrl-C in that time must end the command quietly
(exit 130, as ``cli_support.guarded`` does once a command runs), not print the import's
``KeyboardInterrupt`` traceback. Nothing is imported here before the ``try``."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from conveyor.cli import main as run

        return run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
