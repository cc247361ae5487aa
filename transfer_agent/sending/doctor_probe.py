"""The sender's side of ``fstream doctor`` (issue 30): measure the path to one receiver.

``PathProbe.run()`` opens an authenticated doctor connection (HELLO ``role: "doctor"``, served by
``receiving.doctor``) and measures: the RTT (PING/PONG request/replies, median of several, and the kernel's
``tcpi_rtt`` of that connection), the clock skew (the receiver's wall clock in each PONG against ours at the
middle of the round trip), both ends' host facts (``wire.hostnet``), the steady rate of one stream and of several
into the receiver's sink (bytes discarded there, nothing written), and the receiver's disk write rate (its bounded
probe). What it returns is plain data: the CLI prints it and ``fstream_provider.tuning.host_advice`` judges it.
With a shared secret its connections ask to be encrypted (HELLO ``encrypt``, like ``fstream send --encrypt``), so a
receiver that requires encryption serves them; the sink's raw bytes are not framed, so the rates are the path's.
"""

from __future__ import annotations

import socket
import ssl
import statistics
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Callable

from transfer_agent.errors import FStreamError, NetworkError, ProtocolError
from transfer_agent.sending.connector import Connector
from transfer_agent.wire import hostnet
from transfer_agent.wire.auth import Handshake
from transfer_agent.wire.protocol import Frame, error_from_body

CHUNK = 1 << 20
SEND_POLL_S = 0.2  # a sender blocked on a full window checks its deadline this often
REPLY_GRACE_S = 25.0  # beyond the probe's own time: the receiver drains (10 s at most) and answers


@dataclass
class ProbePlan:
    """What to measure.

    :param seconds: length of each rate probe (one stream, then ``streams``).
    :param streams: streams of the parallel probe.
    :param pings: PING/PONG round trips (RTT median and clock skew).
    :param disk_bytes: bytes the receiver's disk probe writes at most (0: no disk probe).
    :param disk_seconds: ... and for at most this long.
    :param connect_timeout: seconds to connect and authenticate each connection.
    """

    seconds: float = 3.0
    streams: int = 8
    pings: int = 7
    disk_bytes: int = 64 << 20
    disk_seconds: float = 2.0
    connect_timeout: float = 5.0

    def check(self) -> None:
        """``ValueError`` naming the option and what is accepted."""
        if not 0.2 <= self.seconds <= 10:
            raise ValueError(f"--seconds {self.seconds:g}: a rate probe lasts 0.2 to 10 s")
        if not 1 <= self.streams <= 32:
            raise ValueError(f"--streams {self.streams}: 1 to 32 streams")
        if self.disk_bytes and not (1 << 20) <= self.disk_bytes <= (256 << 20):
            raise ValueError(f"--disk-bytes {self.disk_bytes}: 1 MiB to 256 MiB (or 0: no disk probe)")
        if not 0 < self.disk_seconds <= 10:
            raise ValueError(f"--disk-seconds {self.disk_seconds:g}: more than 0, at most 10 s")


def _at(samples: list[list[float]], times: list[float], t: float) -> float:
    """Bytes a stream had received by time ``t`` (linear between samples; 0 before the first)."""
    if not samples or t < times[0]:
        return 0.0
    i = bisect_right(times, t)
    if i >= len(samples):
        return float(samples[-1][1])
    (t0, b0), (t1, b1) = samples[i - 1], samples[i]
    return b0 + (b1 - b0) * (t - t0) / (t1 - t0) if t1 > t0 else float(b1)


def steady_rate(streams: list[list[list[float]]], rtt_s: float) -> dict[str, float]:
    """The streams' combined rate (bits/s) while all of them were receiving, after a warm-up of ``max(0.5 s,
    10 RTT)`` (at most half of that time: slow start is left out). ``streams``: each stream's ``[[t, bytes], ...]``
    on the receiver's one monotonic clock."""
    streams = [s for s in streams if s]
    if not streams:
        return {"bps": 0.0, "from_s": 0.0, "to_s": 0.0, "bytes": 0}
    t0 = min(s[0][0] for s in streams)
    t_end = min(s[-1][0] for s in streams)
    start = t0 + min(max(0.5, 10 * rtt_s), max(t_end - t0, 0.0) / 2)
    times = [[x[0] for x in s] for s in streams]
    if t_end <= start:  # one burst: everything arrived at once (or nothing after the first read)
        total = sum(s[-1][1] for s in streams)
        span = max(s[-1][0] for s in streams) - t0
        return {"bps": total * 8 / span if span > 0 else 0.0, "from_s": 0.0, "to_s": span, "bytes": total}
    moved = sum(_at(s, ts, t_end) - _at(s, ts, start) for s, ts in zip(streams, times))
    return {"bps": moved * 8 / (t_end - start), "from_s": start - t0, "to_s": t_end - t0,
            "bytes": int(sum(s[-1][1] for s in streams))}


class PathProbe:
    """Measure the path to one receiver (``run``), over connections ``Connector`` opens and authenticates.

    :param host: receiver host.
    :param port: receiver port.
    :param secret: shared secret (None with TLS).
    :param ssl_ctx: client TLS context, or None.
    :param key_id: the receiver's key the secret belongs to (None: ``default``).
    :param plan: what to measure.
    :param say: called with a line of progress per step (e.g. printed to stderr).
    :param encrypt: seal the control frames (HELLO ``encrypt``); default: whenever a shared secret is used (with
        TLS alone the channel is encrypted already).
    """

    def __init__(self, host: str, port: int, secret: bytes | None, ssl_ctx: ssl.SSLContext | None,
                 key_id: str | None = None, plan: ProbePlan | None = None,
                 say: Callable[[str], None] = lambda line: None, encrypt: bool | None = None) -> None:
        self.host, self.port, self.secret, self.ssl_ctx, self.key_id = host, port, secret, ssl_ctx, key_id
        self.encrypt = secret is not None if encrypt is None else encrypt
        self.plan = plan or ProbePlan()
        self.say = say

    def _connect(self, probe: str, **extra: Any) -> Handshake:
        conn = Connector(self.host, self.port, self.secret, self.ssl_ctx, {"role": "doctor", "probe": probe, **extra},
                         timeout=self.plan.connect_timeout, key_id=self.key_id, encrypt=self.encrypt)
        hs = conn.connect_link()
        if hs.peer.get("probe") != probe:
            hs.link.sock.close()
            raise ProtocolError(f"receiver {conn.peer} does not serve `fstream doctor` probes (it answered a doctor "
                                "HELLO without the probe: an older receiver?)")
        return hs

    def run(self) -> dict[str, Any]:
        """Every measurement, as plain data (``rtt``, ``clock``, ``sender``, ``receiver``, ``rate``, ``disk``)."""
        hs = self._connect("control")
        link, sock = hs.link, hs.link.sock
        try:
            sock.settimeout(self.plan.connect_timeout + REPLY_GRACE_S)
            out: dict[str, Any] = {}
            self.say("round trips and clocks")
            out["rtt"], out["clock"] = self._pings(link, sock)
            link.send(Frame.FACTS, {})
            out["receiver"] = self._expect(link, Frame.FACTS)
            out["sender"] = hostnet.host_facts(sock)
            rtt = out["rtt"]["median_s"]
            self.say(f"one stream for {self.plan.seconds:g} s")
            single = self._rate(1, rtt)
            self.say(f"{self.plan.streams} streams for {self.plan.seconds:g} s")
            parallel = self._rate(self.plan.streams, rtt)
            out["rate"] = {"seconds": self.plan.seconds, "single": single, "parallel": parallel,
                           "streams": self.plan.streams}
            out["disk"] = None
            if self.plan.disk_bytes:
                self.say("the receiver's disk")
                link.send(Frame.DISK, {"bytes": self.plan.disk_bytes, "seconds": self.plan.disk_seconds})
                out["disk"] = self._expect(link, Frame.DISK)
            link.send(Frame.BYE, {})
            self._expect(link, Frame.BYE)
            return out
        finally:
            sock.close()

    @staticmethod
    def _expect(link: Any, ftype: Frame) -> dict[str, Any]:
        got, _fid, body = link.recv()
        if got == Frame.ERROR:
            raise error_from_body(body)
        if got != ftype:
            raise ProtocolError(f"doctor: unexpected {got.name} frame (expected {ftype.name})")
        return body

    def _pings(self, link: Any, sock: socket.socket) -> tuple[dict[str, Any], dict[str, Any]]:
        rtts: list[float] = []
        skews: list[tuple[float, float]] = []
        for i in range(self.plan.pings):
            wall0, t0 = time.time(), time.perf_counter()
            link.send(Frame.PING, {"n": i})
            body = self._expect(link, Frame.PONG)
            rtt = time.perf_counter() - t0
            rtts.append(rtt)
            clock = body.get("clock")
            if isinstance(clock, (int, float)) and not isinstance(clock, bool):
                skews.append((rtt, float(clock) - (wall0 + rtt / 2)))
        info = hostnet.tcp_info(sock)
        rtt_out = {"median_s": statistics.median(rtts), "min_s": min(rtts), "samples_s": rtts,
                   "tcpi_rtt_s": info["rtt_us"] / 1e6 if info else None,
                   "tcpi_rttvar_s": info["rttvar_us"] / 1e6 if info else None}
        best = min(skews)[1] if skews else None  # the shortest round trip bounds the error best
        clock_out = {"skew_s": best, "median_skew_s": statistics.median(s for _r, s in skews) if skews else None,
                     "error_bound_s": min(skews)[0] / 2 if skews else None}
        return rtt_out, clock_out

    def _rate(self, streams: int, rtt_s: float) -> dict[str, Any]:
        """``streams`` connections to the receiver's sink, started together, each sending until the sink counted
        ``plan.seconds`` from its first byte; their combined steady rate (``steady_rate``) and retransmits."""
        seconds = self.plan.seconds
        conns: list[Handshake] = []
        try:
            for _ in range(streams):
                conns.append(self._connect("sink", seconds=seconds))
            start = threading.Barrier(streams)
            results: list[dict[str, Any] | None] = [None] * streams
            errors: list[BaseException] = []

            def one(i: int) -> None:
                try:
                    start.wait(timeout=self.plan.connect_timeout)
                    results[i] = self._stream(conns[i], seconds)
                except BaseException as exc:  # noqa: BLE001 - reported after join
                    errors.append(exc)
                    start.abort()

            threads = [threading.Thread(target=one, args=(i,), name=f"fstream-doctor-{i}", daemon=True)
                       for i in range(streams)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
                raise first if isinstance(first, FStreamError) else NetworkError(f"rate probe: {first}")
        finally:
            for hs in conns:
                hs.link.sock.close()
        series = [r["samples"] for r in results if r]
        rate = steady_rate(series, rtt_s)
        infos = [r["tcp_info"] for r in results if r and r.get("tcp_info")]
        rate["retransmits"] = sum(i["total_retrans"] for i in infos) if infos else None
        rate["streams"] = streams
        return rate

    def _stream(self, hs: Handshake, seconds: float) -> dict[str, Any]:
        """Send zeros until the receiver's sink reports (it counts ``seconds`` from the first byte), read the report."""
        sock = hs.link.sock
        view = memoryview(bytes(CHUNK))
        sock.settimeout(SEND_POLL_S)
        give_up = time.monotonic() + seconds + REPLY_GRACE_S
        off = 0
        while not hostnet.readable(sock, 0):  # the report is the only thing the receiver sends: stop at it
            if time.monotonic() > give_up:
                raise NetworkError(f"rate probe: the receiver's sink did not report within "
                                   f"{seconds + REPLY_GRACE_S:g} s")
            try:
                off += sock.send(view[off:])
            except TimeoutError:
                continue
            except OSError as exc:
                raise NetworkError(f"rate probe: connection to the receiver lost: {exc}") from None
            if off >= CHUNK:
                off = 0
        info = hostnet.tcp_info(sock)
        sock.settimeout(REPLY_GRACE_S)
        body = self._expect(hs.link, Frame.BYE)
        samples = body.get("samples")
        if not isinstance(samples, list):
            raise ProtocolError("doctor: the receiver's sink reported no samples")
        return {"samples": samples, "bytes": body.get("bytes"), "tcp_info": info}
