"""RabbitMQ: every broker name (topology) and connection helpers."""
