"""The outbox relay."""
