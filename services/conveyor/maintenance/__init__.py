"""Maintenance duties. They run inside the publisher process (``conveyor publisher``), or alone
as ``conveyor sweeper``; every duty is safe to run in several processes at once."""
