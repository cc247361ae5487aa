"""A real Redis Sentinel group for tests and benchmarks: a master, a replica, one sentinel (quorum 1), a failover and an
outage on demand.

Both servers keep an AOF (``appendfsync always``); the sentinel notices a dead master after ``down-after`` ms and
promotes the replica. ``failover()`` SIGKILLs the master, waits until the sentinel names the replica, then starts
the old master again on its port as a replica of the new one (what the sentinel would do to it, done at once);
``outage()`` stops both for a while; ``switch()`` hands the master's role to the replica as an operator or an
orchestrator does (``REPLICAOF``: clients blocked on the old master are answered ``-UNBLOCKED``). Clients follow
the changes through ``url`` (``redis+sentinel://…/m1``), as a deployment's would. Used by
tests/test_airflow_bus_outage.py, tests/test_airflow_under_faults.py and ``fstream bench airflow-soak``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from fstream_bench.core.children import end
from fstream_provider.bus.client import connect
from fstream_provider.bus.embedded import RedisServer, find_redis_server, free_port

MASTER_NAME = "m1"


def _poll(pred, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = pred()
        except Exception:  # noqa: BLE001 - a server starting or failing over answers with errors meanwhile
            value = None
        if value:
            return value
        time.sleep(0.1)  # polling other processes with a deadline
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class SentinelGroup:
    """A master and a replica (``RedisServer``, AOF) watched by one sentinel.

    :param directory: where the three keep their data, configs and logs.
    :param down_after_ms: how long the master must be unreachable before the sentinel fails over.
    """

    def __init__(self, directory: Path, *, down_after_ms: int = 1000) -> None:
        self.dir = Path(directory)
        self.servers = [RedisServer(str(self.dir / "a"), appendonly=True),
                        RedisServer(str(self.dir / "b"), appendonly=True)]
        self.down_after_ms = down_after_ms
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.failovers = 0
        self.promoted: int | None = None  # the port the sentinel named after the last failover's kill

    @property
    def url(self) -> str:
        """The Sentinel URL clients use (``bus.client``): it names the sentinel and the master's name."""
        return f"redis+sentinel://127.0.0.1:{self.port}/{MASTER_NAME}?db=0"

    def start(self) -> "SentinelGroup":
        master, replica = (s.start() for s in self.servers)
        c = connect(replica.url)
        try:
            c.execute_command("REPLICAOF", "127.0.0.1", str(master.port))
            _poll(lambda: c.info("replication").get("master_link_status") == "up", "the replica in sync")
        finally:
            c.close()
        self.port = free_port()
        conf = self.dir / "sentinel.conf"
        conf.write_text(f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
                        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master.port} 1\n"
                        f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                        f"sentinel failover-timeout {MASTER_NAME} 10000\n")
        log = open(self.dir / "sentinel.log", "ab")
        self.proc = subprocess.Popen([find_redis_server(), str(conf), "--sentinel"], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        _poll(lambda: self.master_port() == master.port, "the sentinel to name the master")
        _poll(lambda: self._sentinel().execute_command("SENTINEL", "REPLICAS", MASTER_NAME), "the sentinel to see "
              "the replica")
        return self

    def _sentinel(self):
        return connect(f"redis://127.0.0.1:{self.port}/0", retries=0)

    def master_port(self) -> int | None:
        """The master's port as the sentinel names it now."""
        c = self._sentinel()
        try:
            addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
        finally:
            c.close()
        return int(addr[1]) if addr else None

    def master(self) -> RedisServer:
        port = self.master_port()
        return next(s for s in self.servers if s.port == port)

    def failover(self, timeout: float = 60.0) -> float:
        """SIGKILL the master; wait until the sentinel promoted the replica; start the old master again and wait until
        the group is whole (``settle``). Returns the seconds until the sentinel named a new master, whose port is kept
        in ``promoted``: on a loaded host the sentinel may fail back to the old server while the group settles, so
        the master afterwards is not proof of the failover."""
        old = self.master()
        started = time.monotonic()
        old.kill()
        self.promoted = _poll(lambda: (p := self.master_port()) != old.port and p, "the sentinel to promote the "
                              "replica", timeout)
        promoted = time.monotonic() - started
        old.start()
        self.settle(timeout)
        self.failovers += 1
        return promoted

    def switch(self, timeout: float = 60.0) -> int:
        """Hand the master's role to the replica without killing anything, as an operator or an orchestrator does
        it: ``REPLICAOF NO ONE`` on the replica, the sentinel told to watch it (``SENTINEL REMOVE``/``MONITOR``),
        then ``REPLICAOF`` on the old master, which answers every client blocked on it with ``-UNBLOCKED … instance
        state changed`` and keeps their connections (a sentinel's own failover kills them: ``CLIENT KILL``).
        Returns the new master's port once the group is whole (``settle``)."""
        old = self.master()
        new = next(s for s in self.servers if s is not old)
        c_new, c_old, sentinel = connect(new.url, retries=0), connect(old.url, retries=0), self._sentinel()
        try:
            c_new.execute_command("REPLICAOF", "NO", "ONE")
            sentinel.execute_command("SENTINEL", "REMOVE", MASTER_NAME)
            sentinel.execute_command("SENTINEL", "MONITOR", MASTER_NAME, "127.0.0.1", str(new.port), "1")
            sentinel.execute_command("SENTINEL", "SET", MASTER_NAME, "down-after-milliseconds",
                                     str(self.down_after_ms), "failover-timeout", "10000")
            c_old.execute_command("REPLICAOF", "127.0.0.1", str(new.port))
        finally:
            for c in (c_new, c_old, sentinel):
                c.close()
        return self.settle(timeout)

    def outage(self, seconds: float, timeout: float = 60.0) -> None:
        """Stop both servers (SIGTERM: each finishes its AOF) for ``seconds``, then start the master first and the
        replica after it: Redis is simply gone for a while (the sentinel's failover finds no replica to promote),
        as in a facility-wide restart; then wait until the group is whole (``settle``)."""
        master = self.master()
        replica = next(s for s in self.servers if s is not master)
        replica._reap(signal.SIGTERM)
        master._reap(signal.SIGTERM)
        time.sleep(seconds)  # the fault: no Redis at all for this long
        master.start()
        replica.start()
        self.settle(timeout)

    def settle(self, timeout: float = 60.0) -> int:
        """Wait until the sentinel names a master that acts as one and the other server replicates it in sync; returns
        the master's port. What the sentinel does to a server that comes back (``REPLICAOF`` the master) is done at
        once, and again whenever the roles changed meanwhile: on a loaded host the sentinel may fail over a second
        time (a just-promoted master slow to answer its PING within ``down-after``), and the group must end whole
        whichever server is master."""
        def whole() -> int | None:
            port = self.master_port()
            if port is None:
                return None
            master = next(s for s in self.servers if s.port == port)
            other = next(s for s in self.servers if s is not master)
            m, o = connect(master.url, retries=0), connect(other.url, retries=0)
            try:
                if m.info("replication").get("role") != "master":
                    return None
                info = o.info("replication")
                if info.get("role") != "slave" or int(info.get("master_port") or 0) != port:
                    o.execute_command("REPLICAOF", "127.0.0.1", str(port))
                    return None
                return port if info.get("master_link_status") == "up" else None
            finally:
                m.close()
                o.close()

        return _poll(whole, "the group whole again (a master the sentinel names, its replica in sync)", timeout)

    def stop(self) -> None:
        end(self.proc, 20, None)
        for s in self.servers:
            s.stop()
