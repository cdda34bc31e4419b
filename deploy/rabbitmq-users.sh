#!/bin/sh
# Conveyor broker users for namespace jobs (conveyor roles amqp)
set -eu
rabbitmqctl add_user conveyor_publisher "$CONVEYOR_PUBLISHER_AMQP_PASSWORD" >/dev/null 2>&1 || rabbitmqctl change_password conveyor_publisher "$CONVEYOR_PUBLISHER_AMQP_PASSWORD"
rabbitmqctl set_permissions -p '/' conveyor_publisher '^jobs\.(exchange|dead_letter|dead_letter\.queue|retry|retry\.[^.]+|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$' '^jobs\.(exchange|dead_letter|dead_letter\.queue|retry\.[^.]+|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$' '^jobs\.(exchange|dead_letter|retry\.[^.]+)$'
rabbitmqctl add_user conveyor_worker "$CONVEYOR_WORKER_AMQP_PASSWORD" >/dev/null 2>&1 || rabbitmqctl change_password conveyor_worker "$CONVEYOR_WORKER_AMQP_PASSWORD"
rabbitmqctl set_permissions -p '/' conveyor_worker '^jobs\.(exchange|dead_letter|dead_letter\.queue|retry|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$' '^jobs\.(dead_letter|dead_letter\.queue|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$' '^jobs\.(exchange|dead_letter|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$'
rabbitmqctl add_user conveyor_sweeper "$CONVEYOR_SWEEPER_AMQP_PASSWORD" >/dev/null 2>&1 || rabbitmqctl change_password conveyor_sweeper "$CONVEYOR_SWEEPER_AMQP_PASSWORD"
rabbitmqctl set_permissions -p '/' conveyor_sweeper '^jobs\.(exchange|dead_letter|dead_letter\.queue|retry|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$' '^jobs\.(dead_letter\.queue)$' '^jobs\.(dead_letter)$'
