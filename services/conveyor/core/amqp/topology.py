"""Moved to ``conveyor.broker.topology`` (issue 10: one broker module owns every AMQP concern).
Kept as a re-export until the worker imports ``conveyor.broker`` directly; then delete it."""

from __future__ import annotations

from ...broker.topology import Topology, connect

__all__ = ["Topology", "connect"]
