"""``fstream doctor``'s judgement (issue 30): a path's measurements in, host-tuning advice and a verdict out.

Pure (no I/O, no clock): ``diagnose(PathReport)`` turns the RTT, the rate probes (one stream and several), both
ends' TCP sysctls and MTUs, the receiver's disk rate and free space, the clock skew and the modes of the secret
files into advice items in the words of host-tuning guides (ESnet fasterdata: what to set, where, and why), each
with a stable ``code``, and a one-line verdict naming what limits a transfer on the path:

* ``buffer cap``: one stream moves about what its window allows over the RTT (min of the sender's
  ``tcp_wmem`` and the receiver's ``tcp_rmem`` maximum, divided by the RTT), and several streams move much more;
* ``bottleneck``: one stream and several move the same, well below what the buffers allow: the path's rate is
  what it is (unless ``bandwidth_bps``, what the path should carry, says it delivers that: then ``none found``);
* ``destination disk``: the receiver's disk writes slower than the network delivers;
* ``none found``: none of these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

VERDICTS = ("buffer cap", "bottleneck", "destination disk", "none found")
NEAR_WINDOW = 1.25  # one stream at most this much above window/RTT is "at the window" (kernel estimates are rough)
WINDOW_FLOOR = 0.3  # ... and at least this share of it (far below, something else holds one stream back)
PARALLEL_GAIN = 1.4  # several streams moving this much more than one: more streams help
SAME_RATE = 1.25  # several streams within this factor of one: they move the same
HEADROOM = 1.5  # the window allows at least this much more than one stream moved
DISK_SHORT = 0.9  # a disk below this share of the network's rate is what limits
DELIVERS = 0.8  # a path moving this share of the rate it should carry (bandwidth_bps) is healthy
SKEW_WARN_S = 1.0
FREE_WARN_SHARE = 0.05
MIN_RECOMMENDED = 16 << 20
MAX_RECOMMENDED = 1 << 30


def _ints(text: object) -> tuple[int, ...] | None:
    if not isinstance(text, str):
        return None
    try:
        return tuple(int(x) for x in (text or "").split()) or None
    except ValueError:
        return None


def _int(text: object) -> int | None:
    values = _ints(text)
    return values[0] if values else None


@dataclass(frozen=True)
class HostTcp:
    """One end's TCP configuration (None: unknown).

    :param rmem_max: ``net.core.rmem_max`` (caps what a program may ask for with ``SO_RCVBUF``).
    :param wmem_max: ``net.core.wmem_max``.
    :param tcp_rmem: ``net.ipv4.tcp_rmem`` (min, default, max: the max caps receive autotuning).
    :param tcp_wmem: ``net.ipv4.tcp_wmem`` (the max caps send autotuning).
    :param cc: ``net.ipv4.tcp_congestion_control``.
    :param qdisc: ``net.core.default_qdisc``.
    :param interface_mtu: MTU of the interface the doctor's connection uses on this end.
    :param route_mtu: the MTU of the route to the other end, as this end's kernel knows it.
    """

    rmem_max: int | None = None
    wmem_max: int | None = None
    tcp_rmem: tuple[int, ...] | None = None
    tcp_wmem: tuple[int, ...] | None = None
    cc: str | None = None
    qdisc: str | None = None
    interface_mtu: int | None = None
    route_mtu: int | None = None

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> "HostTcp":
        """From ``wire.hostnet.host_facts``'s shape: ``{"sysctl": {...}, "interface_mtu": ..., "route_mtu": ...}``."""
        s = facts.get("sysctl")
        s = s if isinstance(s, Mapping) else {}

        def text(name: str) -> str | None:
            value = s.get(name)
            return value if isinstance(value, str) else None

        def mtu(name: str) -> int | None:
            value = facts.get(name)
            return value if type(value) is int and value > 0 else None

        return cls(rmem_max=_int(text("net.core.rmem_max")), wmem_max=_int(text("net.core.wmem_max")),
                   tcp_rmem=_ints(text("net.ipv4.tcp_rmem")), tcp_wmem=_ints(text("net.ipv4.tcp_wmem")),
                   cc=text("net.ipv4.tcp_congestion_control"), qdisc=text("net.core.default_qdisc"),
                   interface_mtu=mtu("interface_mtu"), route_mtu=mtu("route_mtu"))

    @property
    def rmem_cap(self) -> int | None:
        return self.tcp_rmem[-1] if self.tcp_rmem else None

    @property
    def wmem_cap(self) -> int | None:
        return self.tcp_wmem[-1] if self.tcp_wmem else None


@dataclass(frozen=True)
class SecretFile:
    """A key file the doctor used: where, its permission bits, what it is (``secret file``, ``TLS key``)."""

    path: str
    mode: int
    what: str = "secret file"


@dataclass(frozen=True)
class PathReport:
    """What ``fstream doctor`` measured (rates in bits/s, sizes in bytes).

    :param rtt_s: the path's round-trip time.
    :param single_bps: one stream's steady rate (None: not measured).
    :param parallel_bps: ``streams`` streams' steady rate together.
    :param streams: streams of the parallel probe.
    :param sender: this end's TCP configuration (data leaves here).
    :param receiver: the receiver's.
    :param disk_bps: the receiver's fdatasync'ed write rate under its root (None: not measured).
    :param free_bytes: free space of the receiver's root.
    :param total_bytes: size of that filesystem.
    :param clock_skew_s: the receiver's wall clock minus ours (RTT corrected).
    :param secrets: the key files used.
    :param bandwidth_bps: what the path should carry (``--bandwidth``), if known.
    """

    rtt_s: float
    single_bps: float | None = None
    parallel_bps: float | None = None
    streams: int = 8
    sender: HostTcp = field(default_factory=HostTcp)
    receiver: HostTcp = field(default_factory=HostTcp)
    disk_bps: float | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    clock_skew_s: float | None = None
    secrets: tuple[SecretFile, ...] = ()
    bandwidth_bps: float | None = None


@dataclass(frozen=True)
class Advice:
    """One finding: ``code`` (stable, for scripts), ``severity`` (``error``: fstream will not work, ``cause``:
    what the verdict names, ``warn``, ``info``), ``side`` (``sender``, ``receiver``, ``both``, ``path``), the
    advice in words, and the settings it recommends (sysctl name → value)."""

    code: str
    severity: str
    side: str
    text: str
    settings: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Diagnosis:
    """The verdict (one of ``VERDICTS``), its one-line reason, the advice, and the numbers they rest on."""

    verdict: str
    reason: str
    advice: tuple[Advice, ...]
    window_bytes: int | None
    window_cap_bps: float | None
    path_bps: float | None
    bdp_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"advice": [asdict(a) for a in self.advice]}


def rate_text(bps: float) -> str:
    """``52 Mbit/s``, ``1.2 Gbit/s``."""
    for unit, div in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= div:
            v = bps / div
            return f"{v:.1f} {unit}" if v < 10 else f"{v:.0f} {unit}"
    return f"{bps:.0f} bit/s"


def size_text(n: float) -> str:
    """``256 KiB``, ``16 MiB``, ``4.8 MiB``, ``2 GiB``."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) or v >= 10 else f"{v:.2g} {unit}"
    return f"{n / 1024:.0f} KiB"


def recommended_buffer(bdp: float) -> int:
    """At least twice the BDP as a power of two, no less than 16 MiB (ESnet's floor), at most 1 GiB."""
    size = MIN_RECOMMENDED
    while size < 2 * bdp and size < MAX_RECOMMENDED:
        size *= 2
    return size


def _buffer_advice(host: HostTcp, side: str, kind: str, rtt: float, bdp: float | None, path_bps: float | None,
                   binding: bool) -> Advice | None:
    cap = host.rmem_cap if kind == "r" else host.wmem_cap
    triple = host.tcp_rmem if kind == "r" else host.tcp_wmem
    if cap is None or bdp is None or path_bps is None or cap >= 2 * bdp:
        return None
    rec = recommended_buffer(bdp)
    name, core = f"net.ipv4.tcp_{kind}mem", f"net.core.{kind}mem_max"
    head = triple[:2] if triple and len(triple) == 3 else (4096, 131072 if kind == "r" else 16384)
    where = "on the receiver" if side == "receiver" else "on the sender (this host)"
    text = (f"{name} max {where} is {size_text(cap)}: one stream can hold at most {size_text(cap)} in flight, "
            f"which at {rtt * 1e3:.3g} ms RTT caps it near {rate_text(cap * 8 / rtt)}; the path's bandwidth-delay "
            f"product is {size_text(bdp)} ({rate_text(path_bps)} x {rtt * 1e3:.3g} ms): set {core} and the third "
            f"field of {name} to at least 2x BDP (e.g. {size_text(rec)}) {where}")
    return Advice(f"{kind}mem_cap", "cause" if binding else "warn", side, text,
                  {core: str(rec), name: f"{head[0]} {head[1]} {rec}"})


def _verdict(m: PathReport, window_cap: float | None, net_bps: float | None) -> tuple[str, str]:
    s, p, n = m.single_bps, m.parallel_bps, m.streams
    if m.disk_bps is not None and net_bps and m.disk_bps < DISK_SHORT * net_bps:
        return "destination disk", (f"the receiver's disk writes {rate_text(m.disk_bps)} (fdatasync'ed), below the "
                                    f"{rate_text(net_bps)} the network delivers")
    if s and p and window_cap:
        window = window_cap * m.rtt_s / 8
        at_window = WINDOW_FLOOR * window_cap <= s <= NEAR_WINDOW * window_cap
        more = max(p, m.bandwidth_bps or 0.0)
        if at_window and more >= PARALLEL_GAIN * s:
            return "buffer cap", (f"one stream moves {rate_text(s)}, close to what a {size_text(window)} window "
                                  f"allows at {m.rtt_s * 1e3:.3g} ms ({rate_text(window_cap)}), while {n} streams "
                                  f"move {rate_text(p)}")
        if p <= SAME_RATE * s and window_cap >= HEADROOM * s:
            if m.bandwidth_bps and p >= DELIVERS * m.bandwidth_bps:
                return "none found", (f"{n} streams move {rate_text(p)} of the {rate_text(m.bandwidth_bps)} the path "
                                      f"should carry; one stream {rate_text(s)}")
            return "bottleneck", (f"one stream ({rate_text(s)}) and {n} streams ({rate_text(p)}) move the same, while "
                                  f"the buffers allow {rate_text(window_cap)} per stream: the path's rate is the limit")
    return "none found", "no limit found below the measured rates" + (f" ({n} streams: {rate_text(p)})" if p else "")


def _path_advice(m: PathReport, verdict: str, window_cap: float | None, net_bps: float | None) -> list[Advice]:
    out: list[Advice] = []
    s, p = m.single_bps, m.parallel_bps
    if verdict == "buffer cap" and p and s:
        out.append(Advice("streams_help", "info", "path",
                          f"until the buffers are raised, parallel streams get around the cap: {m.streams} streams "
                          f"moved {rate_text(p)}, one {rate_text(s)} (fstream's tuners open several per channel)"))
    if verdict == "bottleneck" and p and window_cap:
        should = f" of the {rate_text(m.bandwidth_bps)} it should carry" if m.bandwidth_bps else ""
        out.append(Advice("path_rate", "cause", "path",
                          f"the path carries {rate_text(p)}{should} with one stream and with {m.streams}: more streams "
                          f"or bigger buffers will not help (they allow {rate_text(window_cap)} per stream); if it "
                          "should carry more, look at the path: a slower link, a policer, or traffic sharing it"))
    if verdict == "destination disk" and m.disk_bps and net_bps:
        out.append(Advice("disk_slow", "cause", "receiver",
                          f"the receiver's disk writes {rate_text(m.disk_bps)} with fdatasync, below the "
                          f"{rate_text(net_bps)} the network delivers: files land no faster than the disk; put the "
                          "destination root on faster storage (a striped array, NVMe, a parallel filesystem) or "
                          "look for competing writers"))
    return out


def _host_advice(m: PathReport, path_bps: float | None) -> list[Advice]:
    out: list[Advice] = []
    snd, rcv = m.sender, m.receiver
    if snd.cc == "reno":
        out.append(Advice("cc_reno", "warn", "sender",
                          "congestion control on the sender is reno: after a loss it regrows its window by one "
                          "segment per RTT, slow on a long path; set net.ipv4.tcp_congestion_control=cubic (or bbr "
                          "with net.core.default_qdisc=fq)", {"net.ipv4.tcp_congestion_control": "cubic"}))
    if snd.cc == "bbr" and snd.qdisc and snd.qdisc != "fq":
        out.append(Advice("bbr_without_fq", "info", "sender",
                          f"the sender uses bbr with net.core.default_qdisc={snd.qdisc}: fasterdata recommends fq "
                          "for paced sending with bbr", {"net.core.default_qdisc": "fq"}))
    routes = [x for x in (snd.route_mtu, rcv.route_mtu) if x]
    if routes and min(routes) < 1500:
        out.append(Advice("mtu_small", "warn", "path",
                          f"the route's MTU is {min(routes)} (below Ethernet's 1500): a tunnel or a mis-set interface "
                          "on the way; every packet carries less, and a black hole drops full-size ones: set "
                          "net.ipv4.tcp_mtu_probing=1 and check the interfaces", {"net.ipv4.tcp_mtu_probing": "1"}))
    ifaces = {x for x in (snd.interface_mtu, rcv.interface_mtu) if x}
    if len(ifaces) > 1 and max(ifaces) <= 9216:
        out.append(Advice("mtu_mismatch", "info", "both",
                          f"the interfaces' MTUs differ (sender {snd.interface_mtu}, receiver {rcv.interface_mtu}): "
                          "segments are sized by the smaller; use the same MTU end to end"))
    elif path_bps and path_bps >= 5e9 and ifaces and max(ifaces) <= 1500:
        out.append(Advice("jumbo_frames", "info", "both",
                          f"at {rate_text(path_bps)} with MTU {max(ifaces)}, fasterdata recommends jumbo frames "
                          "(MTU 9000) if every hop on the path supports them"))
    return out


def _site_advice(m: PathReport) -> list[Advice]:
    out: list[Advice] = []
    if m.free_bytes is not None and m.total_bytes and m.free_bytes < FREE_WARN_SHARE * m.total_bytes:
        out.append(Advice("disk_space", "warn", "receiver",
                          f"the receiver's root has {size_text(m.free_bytes)} free of {size_text(m.total_bytes)} "
                          f"({100 * m.free_bytes / m.total_bytes:.1f} %): transfers that do not fit are refused"))
    if m.clock_skew_s is not None and abs(m.clock_skew_s) > SKEW_WARN_S:
        ahead = "ahead of" if m.clock_skew_s > 0 else "behind"
        out.append(Advice("clock_skew", "warn", "both",
                          f"the receiver's clock is {abs(m.clock_skew_s):.1f} s {ahead} ours (corrected by half the "
                          "RTT): logs, file times and deadlines disagree between the ends; run chrony or ntpd on both"))
    return out + secret_advice(m.secrets)


def secret_advice(files: tuple[SecretFile, ...] | list[SecretFile]) -> list[Advice]:
    """``secret_perms`` for each key file that group or others may read or write."""
    out: list[Advice] = []
    for f in files:
        if f.mode & 0o077:
            why = ("fstream refuses to use it" if f.what == "secret file"
                   else "whoever reads it can pass for this host")
            out.append(Advice("secret_perms", "error" if f.what == "secret file" else "warn", "sender",
                              f"{f.what} {f.path} is mode {f.mode & 0o777:04o}: group or others may read or write "
                              f"it, so it is no secret ({why}): chmod 600 {f.path}"))
    return out


def diagnose(m: PathReport) -> Diagnosis:
    """The verdict and the advice for ``m`` (see the module docstring for the rules)."""
    if not m.rtt_s or m.rtt_s <= 0:
        raise ValueError(f"diagnose: rtt_s must be positive (got {m.rtt_s!r})")
    caps = [c for c in (m.sender.wmem_cap, m.receiver.rmem_cap) if c]
    window = min(caps) if caps else None
    window_cap = window * 8 / m.rtt_s if window else None
    net_bps = max(m.single_bps or 0.0, m.parallel_bps or 0.0) or None
    path_bps = max(net_bps or 0.0, m.bandwidth_bps or 0.0) or None
    bdp = path_bps * m.rtt_s / 8 if path_bps else None
    verdict, reason = _verdict(m, window_cap, net_bps)
    binding = verdict == "buffer cap"
    advice = [a for a in (
        _buffer_advice(m.receiver, "receiver", "r", m.rtt_s, bdp, path_bps,
                       binding and m.receiver.rmem_cap == window),
        _buffer_advice(m.sender, "sender", "w", m.rtt_s, bdp, path_bps, binding and m.sender.wmem_cap == window),
    ) if a is not None]
    advice += _path_advice(m, verdict, window_cap, net_bps) + _host_advice(m, path_bps) + _site_advice(m)
    order = {"error": 0, "cause": 1, "warn": 2, "info": 3}
    advice.sort(key=lambda a: order[a.severity])
    return Diagnosis(verdict, reason, tuple(advice), window, window_cap, path_bps, int(bdp) if bdp else None)
