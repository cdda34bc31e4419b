"""The worker: small parts composed by ``worker.Worker`` (see ``worker.py``)."""

from .worker import Worker, WorkerStatus

__all__ = ["Worker", "WorkerStatus"]
