"""Least privilege in RabbitMQ (docs/security.md): the configure / write / read patterns of
each component's user, for ``rabbitmqctl set_permissions -p <vhost> <user> <conf> <write>
<read>``. Every component declares the part of the topology it uses (idempotent), so each may
configure those names only; the rest follows AMQP's rules:

- publish: write on the exchange; consume: read on the queue;
- queue.bind: write on the queue, read on the exchange.

publisher: publishes to the work, pen and dead-letter exchanges, declares work queues and pens,
reads queue depths (maintenance). worker: consumes its types' queues; of the exchanges it may
write only the dead-letter one (RabbitMQ asks that of whoever declares a queue dead-lettering
to it; Conveyor's worker publishes nothing: retries and dead letters go through the outbox), so
it can neither inject work nor read another type's queue. sweeper: declares the base topology
and reads depths. The API never connects to RabbitMQ. ``conveyor roles amqp`` prints the
commands."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from ..core.jobs import check_type

COMPONENTS = ("publisher", "worker", "sweeper")


def permissions(
    namespace: str, component: str, types: Sequence[str] | None = None
) -> tuple[str, str, str]:
    """(configure, write, read) regexes; ``types``: the worker's job types (default: all)."""
    ns = re.escape(namespace)
    # work queues: ``queue.<type>``, and in quorum mode the high band ``high.<type>`` too; any
    # type's: a job type may contain dots (core.jobs.TYPE_PATTERN)
    anyq = "(queue|high)\\.[A-Za-z0-9][A-Za-z0-9_.-]*"
    queues = (
        "(queue|high)\\.(" + "|".join(re.escape(check_type(t)) for t in types) + ")"
        if types
        else anyq
    )
    base = "exchange|dead_letter|dead_letter\\.queue"  # declare_base
    if component == "publisher":
        conf = f"^{ns}\\.({base}|retry\\.[^.]+|{anyq})$"
        write = f"^{ns}\\.(exchange|dead_letter|dead_letter\\.queue|retry\\.[^.]+|{anyq})$"
        read = f"^{ns}\\.(exchange|dead_letter|retry\\.[^.]+)$"
    elif component == "worker":
        conf = f"^{ns}\\.({base}|{queues})$"
        # dead_letter: declaring a queue whose x-dead-letter-exchange it is needs write on it
        write = f"^{ns}\\.(dead_letter|dead_letter\\.queue|{queues})$"
        read = f"^{ns}\\.(exchange|dead_letter|{queues})$"
    elif component == "sweeper":
        conf = f"^{ns}\\.({base}|{anyq})$"
        write = f"^{ns}\\.(dead_letter\\.queue)$"
        read = f"^{ns}\\.(dead_letter)$"
    else:
        raise ValueError(f"no broker permissions for {component!r} (the API uses none)")
    return conf, write, read


def rabbitmqctl_commands(
    namespace: str, vhost: str = "/", types: Sequence[str] | None = None
) -> str:
    """A shell script creating one user per component with ``rabbitmqctl``, its password from
    ``CONVEYOR_<COMPONENT>_AMQP_PASSWORD``. Idempotent: a user that exists gets the password
    again (rotation) and its permissions reset. ``RABBITMQ_NODENAME`` picks the node
    (docker-compose.yml's ``broker-users`` service runs it against the ``rabbitmq`` one)."""
    variables = [f"CONVEYOR_{c.upper()}_AMQP_PASSWORD" for c in COMPONENTS]
    lines = [
        "#!/bin/sh",
        f"# Conveyor broker users for namespace {namespace} (conveyor roles amqp)",
        "set -eu",
        "# A password goes on stdin, never on a command line: ps would show it, one starting with",
        "# a dash would be read as an option, and Debian's rabbitmqctl wrapper (run as root)",
        "# passes its arguments through sh -c. rabbitmqctl reads one line and trims it, so a",
        "# line break or white space at either end is refused rather than cut.",
        "nl='",
        "'",
        "check() {",
        '  case "$2" in *"$nl"* | [[:space:]]* | *[[:space:]])',
        '    echo "$1: no line break or white space at either end, please" >&2; exit 1 ;;',
        "  esac",
        "}",
        "# every password first: a missing or refused one creates no user at all",
        *[f'check {v} "${{{v}:?is not set}}"' for v in variables],
    ]
    for c, variable in zip(COMPONENTS, variables, strict=True):
        user = f"conveyor_{c}"
        feed = f"printf '%s\\n' \"${variable}\" | rabbitmqctl"
        conf, write, read = permissions(namespace, c, types if c == "worker" else None)
        lines += [
            f"{feed} add_user {user} >/dev/null 2>&1 || {feed} change_password {user} >/dev/null",
            f"rabbitmqctl set_permissions -p {shlex.quote(vhost)} {user} "
            + " ".join(shlex.quote(p) for p in (conf, write, read)),
        ]
    return "\n".join(lines) + "\n"
