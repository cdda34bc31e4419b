"""The worker: small parts composed by ``worker.Worker`` (see ``worker.py``)."""

from .status import WorkerStatus
from .worker import Worker

__all__ = ["Worker", "WorkerStatus"]
