"""Issue 8's soak: a streamed workload under random faults, ended by the invariant check.

``fstream bench soak --minutes N [--seed S] [--loopback]``

- a producer thread writes files (64 KiB–64 MiB, log-uniform, seeded) into a source directory
  over time, each under a hidden temp name renamed into place (as instruments do), at ``--rate``;
- ``fstream send SRC --watch --interval 1s --json`` (a subprocess; inside the source namespace on
  the WAN) streams them to ``fstream receive`` (destination namespace); either side that exits on
  its own is restarted (and counted);
- a fault injector picks a fault every 20–60 s (shorter for short runs, so every kind is hit):
  sender SIGKILL + restart at once, receiver SIGKILL + restart on the same port, the path
  black-holed 5–30 s (WAN only), an already-complete source file touched (expect a clean re-send,
  never mixed content). Kinds are drawn round-robin in a seeded shuffled order;
- recovery time of a fault: from its end until the destination moves again (a new visible file,
  or part files growing);
- at the end: producing stops, the watching sender drains (until every source file is visible at
  the destination, bounded) and is stopped, then one final ``fstream send`` over the whole source
  (no ``--watch``) must exit 0; then the invariant check (DESIGN.md "Rules for never losing
  data"; the same checks as ``tests/faults/invariants.py``): every source file at the destination
  with identical content (sha256), no ``.part``/``.meta`` left, nothing visible that matches no
  source content.

Report: ``bench/results/soak-<stamp>.{json,md}``. Exit status 1 if any invariant fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fstream_provider.model.units import parse_rate

CLI = [sys.executable, "-m", "transfer_agent.cli"]
MiB = 1 << 20


def is_temp(name: str) -> bool:
    """A receiver temp name (same rule as tests/faults/invariants.py)."""
    return name.endswith(".meta") or (name.startswith(".") and (name.endswith(".part") or ".part." in name))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MiB), b""):
            h.update(chunk)
    return h.hexdigest()


class Producer(threading.Thread):
    """Writes seeded files into ``src`` at about ``rate_Bps`` until stopped (temp name, then rename)."""

    def __init__(self, src: Path, rate_Bps: float, seed: int, lo: int = 64 << 10, hi: int = 64 * MiB) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.src, self.rate, self.rnd = src, rate_Bps, random.Random(seed)
        self.lo, self.hi = lo, hi
        self.block = random.Random(seed ^ 0x5EED).randbytes(8 * MiB)
        self.stop = threading.Event()
        self.done: list[Path] = []
        self.bytes = 0
        self.lock = threading.Lock()

    def _size(self) -> int:
        return int(math.exp(self.rnd.uniform(math.log(self.lo), math.log(self.hi))))

    def _write(self, path: Path, idx: int, size: int) -> None:
        tmp = path.parent / f".{path.name}.tmp"
        with open(tmp, "wb") as f:
            off = 0
            while off < size:
                n = min(MiB, size - off)
                start = (idx * 7919 + off // MiB * 104729) % (len(self.block) - MiB)
                chunk = idx.to_bytes(8, "little") + (off // MiB).to_bytes(8, "little") + self.block[start + 16:start + n]
                f.write(chunk[:n])
                off += n
        os.rename(tmp, path)

    def run(self) -> None:
        t0, idx = time.monotonic(), 0
        while not self.stop.is_set():
            size = self._size()
            d = self.src / f"d{idx // 200:03d}"
            d.mkdir(parents=True, exist_ok=True)
            p = d / f"f{idx:06d}.bin"
            self._write(p, idx, size)
            with self.lock:
                self.done.append(p)
                self.bytes += size
            idx += 1
            ahead = t0 + self.bytes / self.rate - time.monotonic()
            if ahead > 0:
                self.stop.wait(ahead)

    def complete(self) -> list[Path]:
        with self.lock:
            return list(self.done)


class Soak:
    """The agents, their supervision, sampling, fault injection and the final check."""

    def __init__(self, args: argparse.Namespace, work: Path, path: Any = None) -> None:
        self.args, self.work, self.path = args, work, path
        self.src, self.dst = work / "src", work / "dst"
        self.src.mkdir(parents=True)
        self.dst.mkdir(parents=True)
        self.logs = work / "logs"
        self.logs.mkdir()
        from transfer_agent.wire.auth import create_secret_file

        self.secret = create_secret_file(work / "secret")
        self.env = {**os.environ, "FSTREAM_STATE_DIR": str(work / "state")}
        self.env.pop("FSTREAM_FAULTPOINT", None)
        self.env.pop("FSTREAM_REDIS_URL", None)
        self.host = path.dst_ip if path is not None else "127.0.0.1"
        self.port = 0
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.rx: subprocess.Popen | None = None
        self.tx: subprocess.Popen | None = None
        self.tx_out: Path | None = None
        self.producer: Producer | None = None
        self.n = 0
        self.sender_runs: list[dict] = []
        self.restarts = {"sender_exited": 0, "receiver_exited": 0}
        self.faults: list[dict] = []
        self.errors: list[str] = []  # the harness's own trouble (a failed restart or injection)
        self.peak = {"sender": {"rss": 0, "fds": 0}, "receiver": {"rss": 0, "fds": 0}}
        self.wire: dict[str, int] = {}  # WAN: the delay line's counters at the end
        self.stopping = threading.Event()
        self.faults_off = threading.Event()
        self.sig = (0, 0)  # (visible files, part bytes) at the destination

    # -- processes ------------------------------------------------------------------------------
    def _popen(self, ns: str, argv: list[str], **kw: Any) -> subprocess.Popen:
        if self.path is not None:
            return self.path.exec(ns, argv, env=self.env, **kw)
        return subprocess.Popen(argv, env=self.env, **kw)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start_receiver(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            self.n += 1
            log = open(self.logs / f"{self.n:03d}-receive.log", "wb")  # noqa: SIM115 - handed to the child
            p = self._popen("dst", [*CLI, "-v", "receive", "--listen", f"{self.host}:{self.port}", "--root",
                                    str(self.dst), "--secret-file", str(self.secret)],
                            stdout=subprocess.PIPE, stderr=log)
            log.close()
            assert p.stdout is not None
            line = p.stdout.readline().decode().strip()
            p.stdout.close()
            if line.startswith("listening on"):
                self.port = int(line.rsplit(":", 1)[1])
                self.rx = p
                return
            p.wait()
            if time.monotonic() > deadline:
                raise RuntimeError(f"fstream receive did not restart on {self.host}:{self.port}: "
                                   f"{(self.logs / f'{self.n:03d}-receive.log').read_text()[-800:]}")
            time.sleep(0.5)  # the port may still be held for a moment after the SIGKILL

    def sender_argv(self, watch: bool) -> list[str]:
        a = self.args
        argv = [*CLI, "-v", "send", str(self.src), "--to", f"fstream://{self.host}:{self.port}/soak",
                "--secret-file", str(self.secret), "--json", "--tuner", "fixed", "--cc", str(a.cc), "--p", str(a.p),
                "--pp", str(a.pp), "--stall-timeout", a.stall_timeout]
        return argv + (["--watch", "--interval", "1s"] if watch else [])

    def start_sender(self) -> None:
        self.n += 1
        self.tx_out = self.logs / f"{self.n:03d}-send.json"
        out = open(self.tx_out, "wb")  # noqa: SIM115 - handed to the child, closed below
        log = open(self.logs / f"{self.n:03d}-send.log", "wb")  # noqa: SIM115
        self.tx = self._popen("src", self.sender_argv(True), stdout=out, stderr=log)
        out.close()
        log.close()

    def _reap_sender(self, how: str) -> None:
        """Record the finished sender run (its --json, if it printed one)."""
        assert self.tx is not None and self.tx_out is not None
        rc = self.tx.wait()
        res = _last_json(self.tx_out)
        self.sender_runs.append({"pid": self.tx.pid, "end": how, "rc": rc, "result": _slim(res)})

    def close(self) -> None:
        """Stop everything this soak started (on any exit, also an exception or Ctrl-C)."""
        self.stopping.set()
        self.faults_off.set()
        if self.producer is not None:
            self.producer.stop.set()
        for p in (self.tx, self.rx):
            self.kill(p)

    def kill(self, p: subprocess.Popen | None) -> None:
        if p is not None and p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p is not None:
            p.wait()

    # -- monitor: supervision, /proc sampling, progress -------------------------------------------
    def scan(self) -> tuple[int, int, int]:
        visible = part = temps = 0
        for dirpath, _d, files in os.walk(self.dst):
            for name in files:
                if is_temp(name):
                    temps += 1
                    try:
                        part += os.stat(os.path.join(dirpath, name)).st_blocks * 512
                    except FileNotFoundError:
                        pass
                else:
                    visible += 1
        return visible, part, temps

    def sample(self) -> None:
        import psutil

        for role, p in (("sender", self.tx), ("receiver", self.rx)):
            if p is None or p.poll() is not None:
                continue
            try:
                ps = psutil.Process(p.pid)
                procs = [ps, *ps.children(recursive=True)]
                rss = sum(q.memory_info().rss for q in procs)
                fds = sum(q.num_fds() for q in procs)
            except (psutil.Error, OSError):
                continue
            pk = self.peak[role]
            pk["rss"], pk["fds"] = max(pk["rss"], rss), max(pk["fds"], fds)

    def monitor(self) -> None:
        last_sample = 0.0
        while not self.stopping.is_set():
            try:
                last_sample = self._monitor_once(last_sample)
            except Exception as exc:  # noqa: BLE001 - supervision must outlive one bad round; reported
                if len(self.errors) < 50:
                    self.errors.append(f"monitor at {self.now():.1f} s: {exc!r}")
                print(f"soak: monitor: {exc!r}", file=sys.stderr, flush=True)
            self.stopping.wait(0.25)

    def _monitor_once(self, last_sample: float) -> float:
        with self.lock:
            if self.tx is not None and self.tx.poll() is not None:
                self._reap_sender("exited by itself")
                self.restarts["sender_exited"] += 1
                self.start_sender()
            if self.rx is not None and self.rx.poll() is not None:
                self.restarts["receiver_exited"] += 1
                self.start_receiver()
        visible, part, _ = self.scan()
        t = self.now()
        for f in self.faults:
            if f.get("recovery_s") is not None or t < f["_end"]:
                continue
            f["_min_part"] = min(f.get("_min_part", part), part)
            if visible > f["_visible"] or part > f["_min_part"] + 64 * 1024:
                f["recovery_s"] = round(t - f["_end"], 2)
        if time.monotonic() - last_sample >= 1.0:
            last_sample = time.monotonic()
            self.sample()
        return last_sample

    # -- faults -----------------------------------------------------------------------------------
    def kinds(self) -> list[str]:
        k = ["sender_kill", "receiver_kill", "source_touch"]
        return k + (["blackhole"] if self.path is not None else [])

    def inject(self, kind: str, rnd: random.Random, producer: Producer) -> dict:
        t = self.now()
        rec: dict = {"kind": kind, "t_s": round(t, 2)}
        end = t
        with self.lock:
            if kind == "sender_kill":
                self.kill(self.tx)
                self._reap_sender("SIGKILL (fault)")
                self.start_sender()
            elif kind == "receiver_kill":
                self.kill(self.rx)
                self.start_receiver()
            elif kind == "blackhole":
                secs = rnd.uniform(5, 30) * self.scale
                self.path.blackhole(secs)
                rec["seconds"] = round(secs, 1)
                end = t + secs
            elif kind == "source_touch":
                done = producer.complete()
                if done:
                    victim = rnd.choice(done)
                    os.utime(victim)
                    rec["file"] = victim.relative_to(self.src).as_posix()
            end = max(end, self.now())
        visible, _part, _ = self.scan()
        rec.update(_end=end, _visible=visible, recovery_s=None)
        self.faults.append(rec)
        print(f"soak {t:7.1f}s: {kind} {rec.get('seconds', rec.get('file', ''))}", file=sys.stderr, flush=True)
        return rec

    def injector(self, duration: float, rnd: random.Random, producer: Producer) -> None:
        lo, hi = min(20.0, duration / 12), min(60.0, duration / 6)
        order: list[str] = []
        while not self.faults_off.wait(rnd.uniform(lo, hi)):
            if not order:
                order = self.kinds()
                rnd.shuffle(order)
            kind = order.pop()
            try:
                rec = self.inject(kind, rnd, producer)
            except Exception as exc:  # noqa: BLE001 - a failed injection is reported, the soak goes on
                self.errors.append(f"injecting {kind} at {self.now():.1f} s: {exc!r}")
                print(f"soak: injecting {kind}: {exc!r}", file=sys.stderr, flush=True)
                continue
            if rec["kind"] == "blackhole" and self.faults_off.wait(rec["seconds"]):
                return

    # -- the run ------------------------------------------------------------------------------------
    def run(self) -> dict:
        a = self.args
        duration = a.minutes * 60
        self.scale = min(1.0, duration / 300)
        rnd = random.Random(a.seed)
        producer = self.producer = Producer(self.src, parse_rate(a.rate) / 8, a.seed)
        self.start_receiver()
        self.start_sender()
        mon = threading.Thread(target=self.monitor, name="soak-monitor", daemon=True)
        inj = threading.Thread(target=self.injector, args=(duration, rnd, producer), name="soak-faults", daemon=True)
        producer.start()
        mon.start()
        inj.start()
        t_end = time.monotonic() + duration
        while time.monotonic() < t_end:
            time.sleep(min(1.0, max(0.0, t_end - time.monotonic())))
        self.faults_off.set()
        inj.join()
        producer.stop.set()
        producer.join()
        produced = producer.complete()
        if self.path is not None:
            self.path.blackhole(0)
        # drain: the watching sender catches up (bounded), then is stopped
        drain_deadline = time.monotonic() + a.drain_timeout
        drained = False
        while time.monotonic() < drain_deadline:
            if self.scan()[0] >= len(produced):
                drained = True
                break
            time.sleep(0.5)
        drain_s = round(a.drain_timeout - max(0.0, drain_deadline - time.monotonic()), 1)
        self.stopping.set()
        mon.join()
        with self.lock:
            if self.tx is not None and self.tx.poll() is None:
                self.tx.send_signal(signal.SIGTERM)
                try:
                    self.tx.wait(30)
                except subprocess.TimeoutExpired:
                    self.kill(self.tx)
            if self.tx is not None:
                self._reap_sender("stopped after the drain")
            if self.rx is not None and self.rx.poll() is not None:
                self.start_receiver()
        # the final send over the whole source must exit 0
        self.n += 1
        out = self.logs / f"{self.n:03d}-send-final.json"
        with open(out, "wb") as fo, open(self.logs / f"{self.n:03d}-send-final.log", "wb") as fl:
            final = self._popen("src", self.sender_argv(False), stdout=fo, stderr=fl)
            try:
                final_rc = final.wait(a.final_timeout)
            except subprocess.TimeoutExpired:
                self.kill(final)
                final_rc = None
        final_res = _last_json(out)
        self.sender_runs.append({"pid": final.pid, "end": "final send", "rc": final_rc, "result": _slim(final_res)})
        if self.rx is not None:
            self.rx.send_signal(signal.SIGTERM)
            try:
                self.rx.wait(30)
            except subprocess.TimeoutExpired:
                self.kill(self.rx)
        if self.path is not None:
            try:
                self.wire = self.path.stats()
            except Exception as exc:  # noqa: BLE001 - a missing counter must not lose the report
                print(f"soak: delay line stats: {exc}", file=sys.stderr)
        inv = check(self.src, self.dst / "soak")
        return self.summary(produced, producer.bytes, final_rc, final_res, inv, drained, drain_s)

    def summary(self, produced: list[Path], produced_bytes: int, final_rc: int | None, final_res: dict | None,
                inv: dict, drained: bool, drain_s: float) -> dict:
        faults = [{k: v for k, v in f.items() if not k.startswith("_")} for f in self.faults]
        by_kind: dict[str, int] = {}
        for f in faults:
            by_kind[f["kind"]] = by_kind.get(f["kind"], 0) + 1
        rec = [f["recovery_s"] for f in faults if f["recovery_s"] is not None]
        total = inv["source_bytes"]
        reported = [r for r in self.sender_runs if r["result"] is not None]
        sent_reported = sum(int(r["result"].get("bytes_sent", 0)) for r in reported)
        killed = [r for r in self.sender_runs if r["result"] is None]
        # delivered bytes of the bigger direction (packets dropped by a black-hole are not counted twice)
        wire = max(self.wire.get("a_tx_bytes", 0), self.wire.get("b_tx_bytes", 0)) or None
        final_ok = final_rc == 0 and bool(final_res and final_res.get("ok"))
        problems = list(inv["problems"]) + [f"soak harness: {e}" for e in self.errors]
        if not final_ok:
            problems.append(f"final fstream send exited {final_rc} (ok={final_res and final_res.get('ok')}): "
                            f"{(final_res or {}).get('failures')}")
        return {
            "files_produced": len(produced), "bytes_produced": produced_bytes,
            "faults": faults, "faults_by_kind": by_kind,
            "recovery_s": {"max": max(rec) if rec else None, "median": round(statistics.median(rec), 2) if rec else None,
                           "unrecovered": sum(1 for f in faults if f["recovery_s"] is None)},
            "agent_restarts_unprovoked": self.restarts,
            "sender_runs": self.sender_runs,
            "bytes_sent_reported": sent_reported, "runs_without_json": len(killed),
            "bytes_resent": (sent_reported - total) if not killed else None,
            "bytes_resent_lower_bound": max(0, sent_reported - total) if killed else None,
            "wire_bytes_src_to_dst": wire,
            "bytes_resent_estimate_wire": (wire - total) if wire else None,
            "peak": self.peak, "drained": drained, "drain_s": drain_s,
            "final_send": {"rc": final_rc, "ok": final_ok, "result": _slim(final_res)},
            "files_verified": inv["verified"], "corrupted_visible": inv["corrupted"],
            "partial_visible": inv["temps"], "files_lost": inv["lost"], "unexpected_visible": inv["unexpected"],
            "problems": problems, "ok": not problems,
        }


def check(src: Path, dst: Path) -> dict:
    """The invariants: every source file at ``dst`` with its content, no temps, nothing foreign or torn."""
    want: dict[str, str] = {}
    total = 0
    for p in sorted(src.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            rel = p.relative_to(src).as_posix()
            want[rel] = sha256(p)
            total += p.stat().st_size
    visible: dict[str, Path] = {}
    temps: list[str] = []
    if dst.exists():
        for dirpath, _d, files in os.walk(dst):
            for name in files:
                p = Path(dirpath) / name
                rel = p.relative_to(dst).as_posix()
                (temps.append(rel) if is_temp(name) else visible.__setitem__(rel, p))
    corrupted = sorted(r for r, p in visible.items() if r in want and sha256(p) != want[r])
    unexpected = sorted(r for r in visible if r not in want)
    lost = sorted(r for r in want if r not in visible)
    problems = []
    if corrupted:
        problems.append(f"{len(corrupted)} visible file(s) with content that matches no source: {corrupted[:10]}")
    if temps:
        problems.append(f"{len(temps)} temp file(s) left: {temps[:10]}")
    if lost:
        problems.append(f"{len(lost)} source file(s) not at the destination: {lost[:10]}")
    if unexpected:
        problems.append(f"{len(unexpected)} visible file(s) not in the source: {unexpected[:10]}")
    return {"source_files": len(want), "source_bytes": total, "verified": len(visible) - len(corrupted) -
            len(unexpected), "corrupted": len(corrupted), "temps": len(temps), "lost": len(lost),
            "unexpected": len(unexpected), "problems": problems}


def _last_json(path: Path) -> dict | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def _slim(res: dict | None) -> dict | None:
    if not res:
        return None
    keep = ("ok", "files", "bytes", "bytes_sent", "resumed_bytes", "verified_files", "skipped_files", "seconds",
            "throughput_bps")
    out = {k: res[k] for k in keep if k in res}
    out["failures"] = [{"dest": f.get("dest"), "reason": f.get("reason")} for f in res.get("failures", [])][:20]
    return out


def markdown(doc: dict) -> str:
    r = doc["result"]
    mi = doc["machine"]
    la = doc["load_average_at_start"]
    gb = r["bytes_produced"] / 1e9
    rec = r["recovery_s"]
    resent = (f"{r['bytes_resent'] / 1e6:.1f} MB" if r["bytes_resent"] is not None else
              f"unknown: {r['runs_without_json']} killed sender runs printed no JSON (the runs that did sent "
              f"{r['bytes_sent_reported'] / 1e6:.1f} MB of {r['bytes_produced'] / 1e6:.1f} MB)")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["faults_by_kind"].items()))
    rx_exit, tx_exit = r["agent_restarts_unprovoked"]["receiver_exited"], r["agent_restarts_unprovoked"]["sender_exited"]
    wire = r["bytes_resent_estimate_wire"]
    wire_txt = (f"{wire / 1e6:.1f} MB (estimate: bytes the delay line delivered, with the few headers of its 64 KiB GSO packets)"
                if wire is not None else "n/a (loopback)")
    pk_tx, pk_rx = r["peak"]["sender"], r["peak"]["receiver"]
    rows = [
        ("files / bytes produced", f"{r['files_produced']} / {gb:.2f} GB"),
        ("faults injected", f"{sum(r['faults_by_kind'].values())} ({kinds})"),
        ("recovery time max / median",
         f"{rec['max']} s / {rec['median']} s ({rec['unrecovered']} without measured recovery)"),
        ("unprovoked agent exits (restarted)", f"sender {tx_exit}, receiver {rx_exit}"),
        ("drained before the final send", f"{r['drained']} ({r['drain_s']} s)"),
        ("final send (no --watch)", f"exit {r['final_send']['rc']}, ok {r['final_send']['ok']}"),
        ("files verified at the destination", str(r["files_verified"])),
        ("bytes re-sent (sum of senders' bytes_sent − total)", resent),
        ("bytes delivered src→dst by the WAN delay line − total", wire_txt),
        ("peak sender RSS / fds", f"{pk_tx['rss'] / MiB:.0f} MiB / {pk_tx['fds']}"),
        ("peak receiver RSS / fds", f"{pk_rx['rss'] / MiB:.0f} MiB / {pk_rx['fds']}"),
        ("corrupted visible / partial (temp) files left", f"{r['corrupted_visible']} / {r['partial_visible']}"),
        ("files lost", str(r["files_lost"])),
    ]
    faults = []
    for f in r["faults"]:
        extra = (f" {f['seconds']} s" if "seconds" in f else "") + (f" {f['file']}" if "file" in f else "")
        faults.append(f"- {f['t_s']:.1f} s {f['kind']}{extra}: recovery {f['recovery_s']} s")
    lines = [
        f"# Soak: {doc['minutes']} min on {doc['where']} — {'PASS' if r['ok'] else 'FAIL'}", "",
        f"command: `{doc['command']}`", "",
        (f"machine: nproc {mi['nproc']}, {mi['cpu']}, kernel {mi['kernel']}; load average at start "
         f"{la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; {doc['started_utc']}"), "",
        "| measure | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows],
        "", ("faults (t, kind, recovery: seconds from the fault's end until the destination moved again; None: "
             "it had not moved before the next fault or the end of the run):"), "", *faults,
    ]
    if r["problems"]:
        lines += ["", "**invariants violated:**", "", *[f"- {p}" for p in r["problems"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fstream bench soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loopback", action="store_true", help="run on loopback (no root, no black-holes)")
    ap.add_argument("--rate", default="64Mbit", help="average production rate (default 64Mbit)")
    ap.add_argument("--cc", type=int, default=4)
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--stall-timeout", default="20s", help="the sender's --stall-timeout (default 20s)")
    ap.add_argument("--drain-timeout", type=float, default=300.0, help="seconds the watching sender gets to catch up")
    ap.add_argument("--final-timeout", type=float, default=600.0, help="seconds the final send may take")
    ap.add_argument("--workdir", default=None, help="where source and destination go (default /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the source and destination")
    ap.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    from fstream_bench.report import machine_info

    if not args.loopback and os.geteuid() != 0:
        print("fstream bench soak: the emulated WAN needs root (use --loopback)", file=sys.stderr)
        return 2
    base = Path(args.workdir or "/var/tmp")
    need = parse_rate(args.rate) / 8 * args.minutes * 60 * 2.2  # source + destination + slack
    free = shutil.disk_usage(base).free
    if need > free:
        print(f"fstream bench soak: {base} has {free / 1e9:.1f} GB free; --rate {args.rate} for {args.minutes} min "
              f"needs about {need / 1e9:.1f} GB (source and destination); lower --rate or use --workdir",
              file=sys.stderr)
        return 2
    work = base / f"fstream-soak-{os.getpid()}"
    work.mkdir(parents=True)
    load0 = os.getloadavg()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    path = None
    try:
        if not args.loopback:
            from fstream_bench.wan.path import WanConfig, WanPath

            path = WanPath(WanConfig(rate_bps=1e9, rtt_s=0.040, buffer_bytes=1 << 20, run_id="sk"))
            path.up()
        soak = Soak(args, work, path)
        try:
            result = soak.run()
        finally:
            soak.close()
    finally:
        if path is not None:
            path.down()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    doc = {"command": "fstream bench soak " + " ".join(argv if argv is not None else sys.argv[1:]),
           "where": "loopback" if args.loopback else "emulated WAN (1 Gbit/s, 40 ms, 1 MiB buffer)",
           "minutes": args.minutes, "seed": args.seed, "started_utc": started, "machine": machine_info(),
           "load_average_at_start": list(load0), "result": result}
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(doc)
    (out / f"soak-{stamp}.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / f"soak-{stamp}.md").write_text(md)
    print(md)
    print(f"report: {out / f'soak-{stamp}.md'}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
