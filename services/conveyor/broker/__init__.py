"""RabbitMQ: the only package that imports aio-pika, aiormq or pamqp.

- ``topology``: every exchange and queue name and their declarations;
- ``wire``: the message format, one encoder and one decoder;
- ``publish``: publishing with confirms and ``mandatory`` (a returned message is a failure),
  with per-type declaration failures isolated;
- ``inspect``: queue depth and dead-letter reading, for the sweeper and operator tools;
- ``consume`` / ``acks``: deliveries for the worker.
"""

# the client libraries' loggers, quietened by the entry points (``core.logging.configure``)
LIBRARY_LOGGERS = ("aiormq", "aio_pika")
