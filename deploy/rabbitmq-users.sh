#!/bin/sh
# Conveyor broker users for namespace jobs (conveyor roles amqp)
set -eu
# A password goes on stdin, never on a command line: ps would show it, one starting with
# a dash would be read as an option, and Debian's rabbitmqctl wrapper (run as root)
# passes its arguments through sh -c. rabbitmqctl reads one line and trims it, so a
# line break or white space at either end is refused rather than cut.
nl='
'
check() {
  case "$2" in *"$nl"* | [[:space:]]* | *[[:space:]])
    echo "$1: no line break or white space at either end, please" >&2; exit 1 ;;
  esac
}
# every password first: a missing or refused one creates no user at all
check CONVEYOR_PUBLISHER_AMQP_PASSWORD "${CONVEYOR_PUBLISHER_AMQP_PASSWORD:?is not set}"
check CONVEYOR_WORKER_AMQP_PASSWORD "${CONVEYOR_WORKER_AMQP_PASSWORD:?is not set}"
check CONVEYOR_SWEEPER_AMQP_PASSWORD "${CONVEYOR_SWEEPER_AMQP_PASSWORD:?is not set}"
printf '%s\n' "$CONVEYOR_PUBLISHER_AMQP_PASSWORD" | rabbitmqctl add_user conveyor_publisher >/dev/null 2>&1 || printf '%s\n' "$CONVEYOR_PUBLISHER_AMQP_PASSWORD" | rabbitmqctl change_password conveyor_publisher >/dev/null
rabbitmqctl set_permissions -p / conveyor_publisher '^jobs\.(exchange|dead_letter|dead_letter\.queue|retry\.[^.]+|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$' '^jobs\.(exchange|dead_letter|dead_letter\.queue|retry\.[^.]+|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$' '^jobs\.(exchange|dead_letter|retry\.[^.]+)$'
printf '%s\n' "$CONVEYOR_WORKER_AMQP_PASSWORD" | rabbitmqctl add_user conveyor_worker >/dev/null 2>&1 || printf '%s\n' "$CONVEYOR_WORKER_AMQP_PASSWORD" | rabbitmqctl change_password conveyor_worker >/dev/null
rabbitmqctl set_permissions -p / conveyor_worker '^jobs\.(exchange|dead_letter|dead_letter\.queue|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$' '^jobs\.(dead_letter|dead_letter\.queue|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$' '^jobs\.(exchange|dead_letter|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$'
printf '%s\n' "$CONVEYOR_SWEEPER_AMQP_PASSWORD" | rabbitmqctl add_user conveyor_sweeper >/dev/null 2>&1 || printf '%s\n' "$CONVEYOR_SWEEPER_AMQP_PASSWORD" | rabbitmqctl change_password conveyor_sweeper >/dev/null
rabbitmqctl set_permissions -p / conveyor_sweeper '^jobs\.(exchange|dead_letter|dead_letter\.queue|(queue|high)\.[A-Za-z0-9][A-Za-z0-9_.-]*)$' '^jobs\.(dead_letter\.queue)$' '^jobs\.(dead_letter)$'
