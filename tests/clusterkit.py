"""A real Redis Cluster for tests: three masters and three replicas on loopback, and a master failover on demand.

``RedisCluster6`` starts six ``redis-server --cluster-enabled yes`` (AOF ``appendfsync always``, each node in
its own directory, ``cluster-node-timeout`` 1000 ms so a dead master is replaced in about two seconds), joins
them with ``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``, and waits until every node
says ``cluster_state:ok``, knows all six nodes and every replica's link to its master is up. ``url`` is the
``redis+cluster://`` form ``fstream_provider.bus.client.connect`` takes. It stops every process it started by
its own ``Popen`` handle, also when the test fails (``with`` or ``cluster()``).

``failover(key)`` replaces the master serving ``key``'s slot: by default it SIGKILLs that master (the
realistic failure: no handover, the replica is promoted by the other masters' vote once the node timeout
passed) and waits until the replica serves the slot and the cluster is ``ok`` again; ``graceful=True`` asks
the replica for ``CLUSTER FAILOVER`` instead. ``restart(node)`` brings a killed node back (it rejoins as a
replica of its old slots' new master), so a later failover has a replica to promote.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from fstream_provider.bus.embedded import find_redis_server, free_port

NODE_TIMEOUT_MS = 1000
READY_S = 30.0


def find_redis_cli() -> str | None:
    """``redis-cli`` next to the server binary, else on PATH (Debian: package ``redis-tools``)."""
    server = find_redis_server()
    near = Path(server).with_name("redis-cli") if server else None
    if near is not None and near.exists():
        return str(near)
    return shutil.which("redis-cli")


def _cluster_port(taken: set[int]) -> int:
    """A free port whose cluster-bus port (port + 10000) is free too."""
    for _ in range(500):
        port = free_port()
        if port in taken or port + 10000 > 65535 or port + 10000 in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise AssertionError("no free port pair for a cluster node")


def wait_for(cond: Callable[[], Any], what: str, timeout: float = READY_S) -> Any:
    """Poll ``cond`` every 20 ms until it gives something true; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
        except (redis.RedisError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout:.0f} s")
        threading.Event().wait(0.02)


@dataclass
class Node:
    """One ``redis-server`` of the cluster, started and stopped by this kit."""

    port: int
    directory: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        """A plain (non-cluster) client of this node alone, for CLUSTER/INFO commands."""
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=5,
                           socket_connect_timeout=2)

    def start(self, server: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", str(self.directory / f"nodes-{self.port}.conf"),
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--appendonly", "yes", "--appendfsync", "always",
             "--repl-diskless-sync-delay", "0", "--save", "", "--dir", str(self.directory),
             "--logfile", str(self.directory / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (no shutdown, no handover) and reap."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def info(self, section: str) -> dict:
        c = self.client()
        try:
            return c.info(section)
        finally:
            c.close()

    def cluster_info(self) -> dict:
        c = self.client()
        try:
            text = c.execute_command("CLUSTER INFO")
        finally:
            c.close()
        if isinstance(text, dict):
            return text
        return dict(line.split(":", 1) for line in str(text).splitlines() if ":" in line)


class RedisCluster6:
    """Three masters, three replicas on 127.0.0.1; see the module docstring.

    :param directory: where each node keeps its AOF, ``nodes-<port>.conf`` and log.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.nodes: list[Node] = []
        self.server = find_redis_server()
        self.cli = find_redis_cli()

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(n.address for n in self.nodes if n.alive())

    def start(self) -> RedisCluster6:
        if not self.server or not self.cli:
            raise RuntimeError("a Redis Cluster needs redis-server and redis-cli (Debian: redis-server, redis-tools)")
        taken: set[int] = set()
        for _ in range(6):
            port = _cluster_port(taken)
            taken |= {port, port + 10000}
            self.nodes.append(Node(port, self.directory / str(port)))
        try:
            for n in self.nodes:
                n.start(self.server)
            for n in self.nodes:
                wait_for(lambda n=n: n.client().ping(), f"node {n.address} answering")
            out = subprocess.run([self.cli, "--cluster", "create", *(n.address for n in self.nodes),
                                  "--cluster-replicas", "1", "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-2000:]} {out.stderr[-2000:]}")
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every node this kit started (by its own handle)."""
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait(10)

    def __enter__(self) -> RedisCluster6:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ topology
    def _live(self) -> list[Node]:
        return [n for n in self.nodes if n.alive()]

    def roles(self) -> dict[str, str]:
        """address -> ``master``/``slave`` as each live node says of itself."""
        return {n.address: n.info("replication")["role"] for n in self._live()}

    def masters(self) -> list[Node]:
        return [n for n in self._live() if n.info("replication")["role"] == "master"]

    def slot_of(self, key: str) -> int:
        c = self._live()[0].client()
        try:
            return int(c.execute_command("CLUSTER KEYSLOT", key))
        finally:
            c.close()

    def master_of(self, key: str) -> Node:
        """The live master that serves ``key``'s slot (as the masters themselves say: CLUSTER SLOTS)."""
        node = self.serving(key)
        if node is None:
            raise AssertionError(f"no live master serves slot {self.slot_of(key)} ({key})")
        return node

    def serving(self, key: str) -> Node | None:
        """``master_of``, or None while no live master serves the slot (during a failover)."""
        slot = self.slot_of(key)
        for n in self.masters():
            c = n.client()
            try:
                ranges = c.execute_command("CLUSTER SLOTS")
            finally:
                c.close()
            for r in ranges:
                start, end, master = int(r[0]), int(r[1]), r[2]
                if start <= slot <= end and int(master[1]) == n.port:
                    return n
        return None

    def replica_of(self, master: Node) -> Node:
        repl = master.info("replication")
        for i in range(int(repl.get("connected_slaves", 0))):
            port = int(repl[f"slave{i}"]["port"])
            return next(n for n in self.nodes if n.port == port)
        raise AssertionError(f"master {master.address} has no connected replica")

    def wait_ok(self, timeout: float = READY_S) -> None:
        """Every live node: ``cluster_state:ok``, knows all six nodes, and every replica's link to its master is up;
        and each master has a replica in sync (so a failover has someone to promote)."""
        live = self._live()

        def ready() -> bool:
            for n in live:
                info = n.cluster_info()
                if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != len(self.nodes):
                    return False
                repl = n.info("replication")
                if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                    return False
            return len([n for n in live if n.info("replication")["role"] == "master"]) == 3

        wait_for(ready, "cluster ok on every node", timeout)

    def failover(self, key: str, *, graceful: bool = False, timeout: float = READY_S) -> tuple[Node, Node]:
        """Replace the master serving ``key``'s slot by its replica; returns ``(old master, new master)``.

        SIGKILL by default (then wait for the promotion by vote and ``cluster_state:ok`` on every live node);
        ``graceful``: ``CLUSTER FAILOVER`` on the replica (a coordinated handover, no write lost)."""
        old = self.master_of(key)
        new = self.replica_of(old)
        if graceful:
            c = new.client()
            try:
                c.execute_command("CLUSTER FAILOVER")
            finally:
                c.close()
        else:
            old.kill()
        wait_for(lambda: new.info("replication")["role"] == "master" and self.serving(key) is new,
                 f"replica {new.address} promoted for {key!r}", timeout)

        def all_ok() -> bool:
            return all(n.cluster_info().get("cluster_state") == "ok" for n in self._live())

        wait_for(all_ok, "cluster ok again after the failover", timeout)
        return old, new

    def restart(self, node: Node, timeout: float = READY_S) -> None:
        """Start a killed node again on its port and directory; wait until it is a replica in sync."""
        assert not node.alive(), f"{node.address} is still running"
        node.start(self.server)
        wait_for(lambda: node.info("replication").get("master_link_status") == "up",
                 f"{node.address} back as a replica in sync", timeout)
        self.wait_ok(timeout)


@contextlib.contextmanager
def cluster(directory: Path) -> Iterator[RedisCluster6]:
    """A started ``RedisCluster6`` in ``directory``, stopped on exit whatever happened."""
    c = RedisCluster6(directory)
    try:
        yield c.start()
    finally:
        c.stop()
