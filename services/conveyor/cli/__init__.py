"""The ``conveyor`` command: one module per command group, and the processes they run."""

from .main import main

__all__ = ["main"]
