"""The dashboard at ``/ui``: server-rendered HTML, one small JS file, no build step."""

from fastapi import FastAPI

from ..attempts import HasConnection
from .pages import add_ui as _add_pages
from .schedules_page import add_schedules_page
from .types_page import add_types_page
from .workflows_page import add_workflows_page


def add_ui(app: FastAPI, api: HasConnection) -> None:
    _add_pages(app, api)
    add_types_page(app, api)  # /ui/types (its own module)
    add_schedules_page(app, api)  # /ui/schedules
    add_workflows_page(app, api)  # /ui/workflows


__all__ = ["add_ui"]
