"""RabbitMQ: the only code that imports aio-pika."""
