"""The ``conveyor`` script's entry point, outside the ``conveyor`` package: importing the package
and its commands takes a second or more, and a Ctrl-C in that time must end the command quietly
(exit 130, as ``conveyor.cli.support.guarded`` does once a command runs), not print the import's
``KeyboardInterrupt`` traceback, and never be lost (an import that catches ``BaseException``
would swallow the exception and the command would start anyway). So from this module's first
statement until the package has imported, SIGINT ends the process at once; then the previous
handler is back for the command. The handler is installed through ``_signal``, the C module,
before anything else is imported: importing ``signal`` or ``typing`` (enum, functools,
collections) takes long enough to be interrupted."""

import _signal  # type: ignore[import-not-found]
import os


def _quit(signum: int, frame: object) -> None:
    os._exit(128 + signum)


_PREVIOUS = _signal.signal(_signal.SIGINT, _quit)

import sys  # noqa: E402  (after the handler: see above)


def main() -> int:
    try:
        from conveyor.cli.main import main as run
    finally:
        _signal.signal(_signal.SIGINT, _PREVIOUS)
    try:
        return run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
