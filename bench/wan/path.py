"""The emulated WAN path: two namespaces, two TUN devices, the C delay line, tbf and TCP buffer caps."""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fstream_bench.wan import netns
from fstream_bench.wan.build import delayline_binary, state_dir
from fstream_bench.wan.netns import WanError
from fstream_provider.model.units import format_bytes, format_rate, parse_duration, parse_rate, parse_size

SRC_IP = "10.213.0.1"
DST_IP = "10.213.0.2"
#: TCP/IP header bytes per segment with timestamps (20 IP + 20 TCP + 12 options).
TCP_IP_OVERHEAD = 52


@dataclass
class WanConfig:
    """What path to build.

    :param rate_bps: bottleneck rate in bits/s, IP bytes on the TUN (tbf, both directions).
    :param rtt_s: round-trip time; each direction is delayed by half of it.
    :param buffer_bytes: max TCP buffer (``tcp_rmem``/``tcp_wmem`` max) in both namespaces.
    :param run_id: names the namespaces ``fswan-<id>-src|dst`` (1-10 of [a-z0-9]).
    :param mtu: MTU of the TUN devices.
    :param queue_bytes: tbf queue limit (router buffer); None = one bandwidth-delay product.
    :param cc: TCP congestion control to set in both namespaces; None keeps the host default.
    :param offload: pass TSO/GSO packets through the TUNs (virtio-net header): same wire
        behaviour (tbf counts every segment), far fewer system calls in the delay line.
    :param rt_priority: SCHED_FIFO priority of the delay line (0: normal scheduling), so a
        loaded machine does not add its run-queue wait to the path's delay.
    :param disk_rate_bps: if set, mount a write-rate-capped disk at :attr:`WanPath.dst_dir`
        for the destination (see :mod:`fstream_bench.wan.storage`).
    :param disk_size_bytes: size of that disk (a sparse image file).
    :param disk_backing_dir: where the image lives; default ``/dev/shm`` (RAM) so that the
        cap, not this machine's own disk, is the limit (written data then uses RAM).
    """

    rate_bps: float = 1e9
    rtt_s: float = 0.040
    buffer_bytes: int = 1 << 20
    run_id: str = "main"
    mtu: int = 1500
    queue_bytes: int | None = None
    cc: str | None = None
    offload: bool = True
    rt_priority: int = 10
    disk_rate_bps: float | None = None
    disk_size_bytes: int = 4 << 30
    disk_backing_dir: str | None = None

    @classmethod
    def from_text(cls, *, rate: str | float = "1Gbit", rtt: str | float = "40ms",
                  buffer: str | int = "1MiB", run_id: str = "main", **kw: Any) -> "WanConfig":
        """Build a config from user text such as ``rate="200Mbit", rtt="20ms", buffer="1MiB"``."""
        return cls(rate_bps=parse_rate(rate), rtt_s=parse_duration(rtt),
                   buffer_bytes=parse_size(buffer), run_id=run_id, **kw)

    @property
    def bdp_bytes(self) -> int:
        return int(self.rate_bps * self.rtt_s / 8)

    @property
    def expected_goodput_bps(self) -> float:
        """TCP payload rate a saturated path delivers: the rate less per-segment headers."""
        return self.rate_bps * (self.mtu - TCP_IP_OVERHEAD) / self.mtu

    def describe(self) -> str:
        return (f"{format_rate(self.rate_bps)}, RTT {self.rtt_s * 1e3:.1f} ms, "
                f"TCP buffer max {format_bytes(self.buffer_bytes)}, MTU {self.mtu}")


@dataclass
class _State:
    """What a running path leaves in ``<state dir>/<run id>.json`` so other processes find it."""

    config: dict[str, Any]
    src_ns: str
    dst_ns: str
    delayline_pid: int
    delayline_argv: list[str]
    ctl_path: str
    background: dict[str, Any] = field(default_factory=dict)
    storage: dict[str, Any] = field(default_factory=dict)


class WanPath:
    """An emulated WAN between a source and a destination namespace.

    Use as a context manager (``with WanPath(cfg) as path: ...``) or call :meth:`up` and
    :meth:`down`. Other processes reach a running path with :meth:`attach`.

    :param config: the path to build (default: 1 Gbit/s, 40 ms RTT, 1 MiB TCP buffer).
    """

    def __init__(self, config: WanConfig | None = None) -> None:
        self.config = config or WanConfig()
        netns.check_run_id(self.config.run_id)
        self.src_ns, self.dst_ns = netns.ns_names(self.config.run_id)
        self.src_dev, self.dst_dev = netns.dev_names(self.config.run_id)
        self.src_ip, self.dst_ip = SRC_IP, DST_IP
        self._proc: subprocess.Popen | None = None
        self._state: _State | None = None
        self._atexit_registered = False

    # ------------------------------------------------------------------ lifecycle
    @property
    def state_file(self) -> Path:
        return state_dir() / f"{self.config.run_id}.json"

    @property
    def ctl_path(self) -> str:
        return str(state_dir() / f"{self.config.run_id}.ctl")

    @property
    def dst_dir(self) -> Path | None:
        """Mount point of the write-capped destination disk (None without a disk limit)."""
        return _disk_paths(self.config.run_id)[1] if self.config.disk_rate_bps else None

    @property
    def disk_cgroup(self) -> str | None:
        """The cgroup-v2 directory whose processes the disk cap applies to (None: no cap, or a v1 cap that
        applies to every writer). :meth:`exec` and :meth:`run` put what they start in ``dst`` there."""
        st = self.state
        return (st.storage or {}).get("cgroup") if st else None

    def _disk_image(self) -> Path:
        base = self.config.disk_backing_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
        return Path(base) / f"fswan-{self.config.run_id}.disk.img" if base else _disk_paths(
            self.config.run_id)[0]

    @property
    def delayline_pid(self) -> int | None:
        return self._state.delayline_pid if self._state else None

    def is_up(self) -> bool:
        """True if both namespaces exist and this run's delay line is alive."""
        st = self._state or _load_state(self.state_file)
        return bool(st and netns.ns_exists(self.src_ns) and netns.ns_exists(self.dst_ns)
                    and _is_our_delayline(st.delayline_pid, self.config.run_id))

    def up(self) -> "WanPath":
        """Build the path; on any failure remove what was built and raise :class:`WanError`."""
        netns.require_root()
        missing = netns.missing_tools()
        if missing:
            raise WanError("the emulated WAN needs: " + ", ".join(missing))
        live = _delaylines_of(self.config.run_id)
        if self.is_up() or live:
            raise WanError(f"WAN path {self.config.run_id!r} is already up "
                           f"(namespaces {self.src_ns}, {self.dst_ns}, delay line pid "
                           f"{','.join(map(str, live)) or '?'}); pick another --run-id or run "
                           "`down` first")
        cleanup_run(self.config.run_id)  # leftovers of a crashed run with this id
        binary = delayline_binary()
        if not self._atexit_registered:
            atexit.register(self._atexit_down)
            self._atexit_registered = True
        try:
            self._build(binary)
        except BaseException:
            self.down()
            raise
        return self

    def _build(self, binary: Path) -> None:
        cfg = self.config
        for ns in (self.src_ns, self.dst_ns):
            netns.run(["ip", "netns", "add", ns])
            netns.run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self._tune_tcp(ns)
        owd_us = int(round(cfg.rtt_s * 1e6 / 2))
        ring = max(16 << 20, 4 * int(cfg.rate_bps / 8 * cfg.rtt_s / 2) + (8 << 20))
        argv = [str(binary), "--ns-a", str(netns.NETNS_DIR / self.src_ns), "--dev-a", self.src_dev,
                "--ns-b", str(netns.NETNS_DIR / self.dst_ns), "--dev-b", self.dst_dev,
                "--delay-us", str(owd_us), "--ctl", self.ctl_path, "--ring-bytes", str(ring)]
        if cfg.offload:
            argv.append("--vnet")
        if cfg.rt_priority > 0:
            argv += ["--rt-prio", str(cfg.rt_priority)]
        errf = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=errf, start_new_session=True)
        self._state = _State(config=asdict(cfg), src_ns=self.src_ns, dst_ns=self.dst_ns,
                             delayline_pid=self._proc.pid, delayline_argv=argv,
                             ctl_path=self.ctl_path)
        self._save_state()  # before anything else can fail: `down` must find the pid
        line = self._proc.stdout.readline().decode(errors="replace") if self._proc.stdout else ""
        if not line.startswith("ready"):
            self._proc.wait(timeout=5)
            errf.seek(0)
            raise WanError(f"delay line {binary} did not start: "
                           f"{errf.read().decode(errors='replace').strip() or line.strip()}")
        errf.close()
        q = cfg.queue_bytes or max(cfg.bdp_bytes, 64 * cfg.mtu)
        burst = max(160_000, int(cfg.rate_bps / 8 * 0.001))  # > one 64 KiB GSO packet, >= 1 ms
        for ns, dev, ip, peer in ((self.src_ns, self.src_dev, SRC_IP, DST_IP),
                                  (self.dst_ns, self.dst_dev, DST_IP, SRC_IP)):
            netns.run(["ip", "-n", ns, "addr", "add", ip, "peer", peer, "dev", dev])
            netns.run(["ip", "-n", ns, "link", "set", dev, "mtu", str(cfg.mtu),
                       "txqueuelen", "10000", "up"])
            netns.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                       "rate", f"{int(cfg.rate_bps)}bit", "burst", str(burst), "limit", str(q)])
        if cfg.disk_rate_bps:
            from fstream_bench.wan.storage import make_disk

            mnt = _disk_paths(cfg.run_id)[1]
            self.update_state(storage={"image": str(self._disk_image()), "mount": str(mnt)})
            info = make_disk(self._disk_image(), mnt, size_bytes=cfg.disk_size_bytes,
                             write_bps=cfg.disk_rate_bps)
            self.update_state(storage=info)

    def _tune_tcp(self, ns: str) -> None:
        buf = self.config.buffer_bytes
        netns.sysctl(ns, "net.ipv4.tcp_rmem", f"4096 {min(131072, buf)} {buf}")
        netns.sysctl(ns, "net.ipv4.tcp_wmem", f"4096 {min(16384, buf)} {buf}")
        # Cached ssthresh/RTT from an earlier connection would make runs depend on their order.
        netns.sysctl(ns, "net.ipv4.tcp_no_metrics_save", "1")
        if self.config.cc:
            try:
                netns.sysctl(ns, "net.ipv4.tcp_congestion_control", self.config.cc)
            except WanError as exc:
                allowed = netns.sysctl_get(None, "net.ipv4.tcp_allowed_congestion_control")
                raise WanError(f"{exc}; a namespace may only pick an algorithm listed in the "
                               f"host's net.ipv4.tcp_allowed_congestion_control ({allowed})") from exc

    def down(self) -> None:
        """Remove everything of this run: background flows, processes, namespaces, files."""
        if self._proc is not None:
            netns.kill_and_wait([self._proc.pid])
            if self._proc.stdout:
                self._proc.stdout.close()
            self._proc.wait()
            self._proc = None
        cleanup_run(self.config.run_id)
        self._state = None

    def detach(self) -> None:
        """Leave the path running after this process exits (``fstream bench wan up``)."""
        if self._proc is not None:
            if self._proc.stdout:
                self._proc.stdout.close()
            self._proc = None

    def _atexit_down(self) -> None:
        if self._proc is not None:
            try:
                self.down()
            except Exception:  # noqa: BLE001 - best effort at interpreter exit
                pass

    def __enter__(self) -> "WanPath":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    @classmethod
    def attach(cls, run_id: str = "main") -> "WanPath":
        """A handle on a path another process brought up (``fstream bench wan up``)."""
        netns.check_run_id(run_id)
        st = _load_state(state_dir() / f"{run_id}.json")
        if st is None:
            raise WanError(f"WAN path {run_id!r} is not up (no state file "
                           f"{state_dir() / (run_id + '.json')}); run `fstream bench wan up`")
        path = cls(WanConfig(**st.config))
        path._state = st
        if not path.is_up():
            raise WanError(f"WAN path {run_id!r} is broken (delay line pid {st.delayline_pid} "
                           "gone or namespaces missing); run `fstream bench wan down` and `up`")
        return path

    def _save_state(self) -> None:
        assert self._state is not None
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self._state), indent=1))
        os.replace(tmp, self.state_file)

    # ------------------------------------------------------------------ using the path
    def ns(self, which: str) -> str:
        """Namespace name for ``"src"``/``"dst"`` (a full name of this run is passed through)."""
        if which in ("src", "source"):
            return self.src_ns
        if which in ("dst", "dest", "destination"):
            return self.dst_ns
        if which in (self.src_ns, self.dst_ns):
            return which
        raise WanError(f"namespace {which!r}: use 'src' or 'dst' (or {self.src_ns}/{self.dst_ns})")

    def exec(self, ns: str, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside namespace ``ns`` ("src"/"dst"); returns the Popen.

        ``ip netns exec`` execs in place, so the Popen's pid is the program itself. In ``dst`` with a
        cgroup-v2 disk cap it first joins :attr:`disk_cgroup` (and still execs in place).
        """
        return subprocess.Popen(self._argv(ns, argv), **popen_kwargs)

    def _argv(self, ns: str, argv: list[str]) -> list[str]:
        name = self.ns(ns)
        full = netns.ns_exec_argv(name, list(argv))
        cgroup = self.disk_cgroup if name == self.dst_ns else None
        if cgroup:  # joined before `ip netns exec`, whose fresh /sys has no cgroup mounts
            from fstream_bench.wan.storage import in_cgroup_argv

            full = in_cgroup_argv(cgroup, full)
        return full

    def run(self, ns: str, argv: list[str], *, check: bool = True,
            timeout: float | None = None, **kw: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``ns`` to completion, capturing text output."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        cp = subprocess.run(self._argv(ns, argv), timeout=timeout, **kw)
        if check and cp.returncode != 0:
            raise WanError(f"{' '.join(argv)} in {self.ns(ns)} failed (exit {cp.returncode}): "
                           f"{(cp.stderr or cp.stdout or '').strip()}")
        return cp

    def control(self, command: str, *, timeout: float = 2.0) -> str:
        """Send one command to the delay line's control socket and return its reply."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.bind("")  # autobind an abstract address so the reply can come back
            s.settimeout(timeout)
            try:
                s.sendto(command.encode(), self.ctl_path)
                reply = s.recv(4096).decode()
            except OSError as exc:
                raise WanError(f"delay line control socket {self.ctl_path}: {exc}") from exc
        if reply.startswith("error"):
            raise WanError(f"delay line refused {command!r}: {reply}")
        return reply

    def stats(self) -> dict[str, int]:
        """Delay line counters (packets, bytes, drops, queue depth)."""
        return {k: int(v) for k, v in (kv.split("=") for kv in self.control("stats").split())}

    def blackhole(self, seconds: float) -> None:
        """Drop every packet in both directions for ``seconds`` (0 ends a black-hole early).

        Connections stay half-open: nothing is reset, packets simply vanish.
        """
        self.control(f"blackhole {float(parse_duration(seconds))}")

    def update_state(self, **fields: Any) -> None:
        """Record extra fields (e.g. background pids) in the state file."""
        st = self._state or _load_state(self.state_file)
        if st is None:
            raise WanError(f"WAN path {self.config.run_id!r} is not up")
        for k, v in fields.items():
            setattr(st, k, v)
        self._state = st
        self._save_state()

    @property
    def state(self) -> _State | None:
        return self._state or _load_state(self.state_file)

    def __repr__(self) -> str:
        return f"WanPath({self.config.run_id!r}: {self.config.describe()})"


def _load_state(path: Path) -> _State | None:
    try:
        return _State(**json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None


def _is_our_delayline(pid: int, run_id: str) -> bool:
    """True if ``pid`` is a live delay line of run ``run_id`` (guards against pid reuse)."""
    argv = netns.pid_cmdline(pid)
    src_ns, _ = netns.ns_names(run_id)
    return (netns.pid_alive(pid) and bool(argv) and "fswan-delayline" in argv[0]
            and str(netns.NETNS_DIR / src_ns) in argv)


def _delaylines_of(run_id: str) -> list[int]:
    """Pids of every delay line process (by its argv) serving run ``run_id``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _is_our_delayline(int(entry), run_id):
            pids.append(int(entry))
    return pids


def cleanup_run(run_id: str) -> list[str]:
    """Remove every trace of run ``run_id``; return what was removed (for messages).

    Only things this testbed names: processes inside ``fswan-<id>-*`` namespaces, delay
    line processes whose argv names those namespaces, the namespaces, the destination disk and
    its ``fswan-<id>-dstdisk`` cgroup, and state files.
    """
    netns.check_run_id(run_id)
    removed: list[str] = []
    names = netns.ns_names(run_id)
    for ns in names:
        if netns.ns_exists(ns):
            pids = netns.ns_pids(ns)
            if pids:
                left = netns.kill_and_wait(pids)
                removed.append(f"{len(pids) - len(left)} process(es) in {ns}")
                if left:
                    raise WanError(f"processes {left} in namespace {ns} survived SIGKILL")
    dl = _delaylines_of(run_id)
    if dl:
        left = netns.kill_and_wait(dl)
        removed.append(f"delay line pid {','.join(map(str, dl))}")
        if left:
            raise WanError(f"delay line pid(s) {left} of run {run_id!r} survived SIGKILL")
    for ns in names:
        if netns.ns_exists(ns):
            netns.run(["ip", "netns", "del", ns])
            removed.append(f"namespace {ns}")
    st = _load_state(state_dir() / f"{run_id}.json")
    image, mnt = _disk_paths(run_id)
    disks = [{"image": str(image), "mount": str(mnt)},
             {"image": f"/dev/shm/fswan-{run_id}.disk.img", "mount": str(mnt)}]
    if st and st.storage:
        disks.insert(0, st.storage)
    for disk in disks:
        if os.path.exists(disk["image"]) or os.path.ismount(disk["mount"]):
            from fstream_bench.wan.storage import remove_disk

            removed += remove_disk(disk)
    from fstream_bench.wan.storage import leftover_cgroups, remove_cgroup

    cgroup = leftover_cgroups().get(run_id)  # a v2 disk cap's cgroup, even with the disk already gone
    if cgroup is not None and remove_cgroup(cgroup):
        removed.append(f"cgroup {cgroup}")
    sd = state_dir()
    for suffix in (".json", ".ctl", ".tmp"):
        f = sd / f"{run_id}{suffix}"
        if f.exists() or f.is_symlink():
            f.unlink()
            removed.append(str(f))
    return removed


def _disk_paths(run_id: str) -> tuple[Path, Path]:
    """(image file, mount point) of a run's capped destination disk."""
    return state_dir() / f"{run_id}.disk.img", state_dir() / f"{run_id}-dstdisk"


def find_runs() -> set[str]:
    """Run ids with anything left on this machine: namespaces, state files, delay lines, disk cgroups."""
    from fstream_bench.wan.storage import leftover_cgroups

    run_ids = set(netns.our_namespaces()) | set(leftover_cgroups())
    for f in state_dir().glob("*.json"):
        if netns.RUN_ID_RE.match(f.stem):
            run_ids.add(f.stem)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            argv = netns.pid_cmdline(int(entry))
            if argv and "fswan-delayline" in argv[0] and "--ns-a" in argv:
                m = netns.NS_RE.match(Path(argv[argv.index("--ns-a") + 1]).name)
                if m:
                    run_ids.add(m.group(1))
    return run_ids


def cleanup_all() -> dict[str, list[str]]:
    """:func:`cleanup_run` for every run id :func:`find_runs` finds (other users' runs too)."""
    return {rid: cleanup_run(rid) for rid in sorted(find_runs())}


def wait_listening(path: WanPath, ns: str, port: int, *, timeout: float = 10.0) -> None:
    """Poll until something listens on TCP ``port`` inside ``ns`` (raise after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = path.run(ns, ["ss", "-Hltn", f"sport = :{port}"], check=False).stdout
        if out.strip():
            return
        time.sleep(0.05)
    raise WanError(f"nothing listens on port {port} in {path.ns(ns)} after {timeout:.0f} s")
