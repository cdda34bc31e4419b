"""The worker: consumes its types' queues and runs the handlers."""
