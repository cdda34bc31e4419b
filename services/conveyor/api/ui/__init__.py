"""The dashboard at ``/ui``: server-rendered HTML, one small JS file, no build step."""

from .pages import add_ui

__all__ = ["add_ui"]
