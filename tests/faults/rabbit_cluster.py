"""A private three-node RabbitMQ cluster on loopback ports (RECIPES.md): each node is a
``PrivateRabbit`` (own name, ports, directories, run as ``rabbitmq`` and so sharing its Erlang
cookie); the three boot at once, nodes 2 and 3 joining node 1 as they boot. A node can be
killed (SIGKILL of its ``beam.smp``, as a machine loss) and started again with the same
environment, when it rejoins."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from .infra import PrivateRabbit, kill


class PrivateCluster:
    def __init__(self, size: int = 3) -> None:
        first = PrivateRabbit()
        self.nodes = [first, *(PrivateRabbit(join=first.node) for _ in range(size - 1))]
        self.pids: dict[str, int] = {}

    @property
    def amqp_url(self) -> str:
        """Every node, comma-separated (``CONVEYOR_AMQP_URL``)."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"amqp://guest:guest@{hosts}/"

    def start(self) -> PrivateCluster:
        """Every node boots at once; the others join the first while they boot."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.start(timeout=120), self.nodes))
        self.pids = {n.node: n.pid() for n in self.nodes}
        assert sorted(self.running()) == sorted(n.node for n in self.nodes), self.running()
        return self

    def by_name(self, node: str) -> PrivateRabbit:
        return next(n for n in self.nodes if n.node == node)

    def running(self, via: PrivateRabbit | None = None) -> list[str]:
        """Running nodes, as one live node sees them."""
        for n in [via] if via else [n for n in self.nodes if n.node in self.pids]:
            assert n is not None
            r = n._run("cluster_status", "--formatter", "json", timeout=30)
            if r.returncode == 0:
                return list(json.loads(r.stdout)["running_nodes"])
        return []

    def queues(self, via: PrivateRabbit) -> dict[str, dict[str, object]]:
        """name → {type, leader, members, messages} as ``via`` sees them."""
        out = via.ctl(
            "list_queues", "name", "type", "leader", "members", "messages", "--formatter", "json"
        )
        return {q["name"]: q for q in json.loads(out)}

    def kill(self, node: str) -> None:
        """SIGKILL the node's Erlang VM: no goodbye to its peers or its clients."""
        kill(self.pids.pop(node))
        self.by_name(node).started = False

    def revive(self, node: str, timeout: float = 120.0) -> float:
        """Start the node again with its environment; returns the seconds until the cluster
        lists it running again."""
        t0 = time.monotonic()
        n = self.by_name(node)
        subprocess.run(["rabbitmq-server", "-detached"], env=n.env(), check=True,
                       capture_output=True)  # fmt: skip
        n.started = True
        deadline = t0 + timeout
        while True:
            r = n._run("await_startup", timeout=timeout)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node} did not come back: {r.stderr[-1000:]}")
            time.sleep(0.3)
        self.pids[node] = n.pid()
        while node not in self.running(self.nodes[0] if self.nodes[0].node != node else n):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node} did not rejoin")
            time.sleep(0.3)
        return time.monotonic() - t0

    def stop(self) -> None:
        """Every node at once (a killed one has only its directories left)."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.stop(), self.nodes))
