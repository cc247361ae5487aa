"""Thin wrappers around `ip netns`, `ip`, `tc` and `sysctl`, plus the testbed's naming rules."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

#: Every namespace this testbed creates is named ``fswan-<run id>-src|dst``; ``down`` only
#: ever touches names that match this pattern.
NS_PREFIX = "fswan-"
NS_RE = re.compile(r"^fswan-([a-z0-9]{1,10})-(src|dst)$")
RUN_ID_RE = re.compile(r"^[a-z0-9]{1,10}$")
NETNS_DIR = Path("/run/netns")


class WanError(RuntimeError):
    """The emulated WAN could not be built, checked or removed; the message says why."""


class NotRootError(WanError):
    """The testbed needs root (network namespaces, TUN devices, tc)."""


def require_root() -> None:
    """Raise :class:`NotRootError` with a clear message unless running as root."""
    if os.geteuid() != 0:
        raise NotRootError(
            "the emulated WAN needs root (it creates network namespaces, TUN devices and tc "
            "qdiscs); run as root, e.g. `sudo fstream bench wan up`")


def missing_tools() -> list[str]:
    """Names of the system pieces the testbed needs that are absent on this machine."""
    missing = [t for t in ("ip", "tc", "iperf3") if shutil.which(t) is None]
    if not (shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")):
        missing.append("cc (C compiler)")
    if not Path("/dev/net/tun").exists():
        missing.append("/dev/net/tun")
    return missing


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is 1-10 lower-case letters/digits, else raise :class:`WanError`."""
    if not RUN_ID_RE.match(run_id or ""):
        raise WanError(f"run id {run_id!r}: use 1-10 lower-case letters or digits "
                       "(it becomes part of namespace and device names)")
    return run_id


def ns_names(run_id: str) -> tuple[str, str]:
    """The (source, destination) namespace names of a run."""
    return f"{NS_PREFIX}{run_id}-src", f"{NS_PREFIX}{run_id}-dst"


def dev_names(run_id: str) -> tuple[str, str]:
    """The (source, destination) TUN device names of a run (at most 15 characters)."""
    return f"fsw{run_id}s", f"fsw{run_id}d"


def run(argv: list[str], *, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run a command, capture its output, raise :class:`WanError` naming it if it fails."""
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise WanError(f"{argv[0]}: not found ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        raise WanError(f"{' '.join(argv)}: no answer within {timeout:.0f} s") from exc
    if check and cp.returncode != 0:
        raise WanError(f"{' '.join(argv)} failed (exit {cp.returncode}): "
                       f"{(cp.stderr or cp.stdout).strip()}")
    return cp


def ns_exec_argv(ns: str, argv: list[str]) -> list[str]:
    """The argv that runs ``argv`` inside namespace ``ns`` (``ip netns exec`` execs in place)."""
    return ["ip", "netns", "exec", ns, *argv]


def list_namespaces() -> list[str]:
    """Names of all named network namespaces (``ip netns list``)."""
    out = run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def our_namespaces() -> dict[str, list[str]]:
    """Run id -> namespace names, for every namespace that carries this testbed's prefix."""
    found: dict[str, list[str]] = {}
    for name in list_namespaces():
        m = NS_RE.match(name)
        if m:
            found.setdefault(m.group(1), []).append(name)
    return found


def ns_exists(ns: str) -> bool:
    """True if the named namespace exists."""
    return (NETNS_DIR / ns).exists()


def ns_pids(ns: str) -> list[int]:
    """Pids of the processes running inside namespace ``ns``."""
    cp = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in cp.stdout.split() if p.isdigit()]


def sysctl(ns: str, key: str, value: str) -> None:
    """Set a sysctl inside a namespace, naming the key and namespace on failure."""
    cp = run(ns_exec_argv(ns, ["sysctl", "-qw", f"{key}={value}"]), check=False)
    if cp.returncode != 0:
        raise WanError(f"sysctl {key}={value!r} in namespace {ns} failed: {cp.stderr.strip()}")


def sysctl_get(ns: str | None, key: str) -> str:
    """Read a sysctl (inside ``ns``, or in the caller's namespace when ``ns`` is None)."""
    argv = ["sysctl", "-n", key]
    return run(ns_exec_argv(ns, argv) if ns else argv).stdout.strip()


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def pid_cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` ([] if it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except (FileNotFoundError, ProcessLookupError):
        return []


def pid_cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds used so far by ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def pid_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by ``pid``."""
    return sum(pid_cpu_times(pid))


def kill_and_wait(pids: list[int], *, timeout: float = 5.0) -> list[int]:
    """SIGTERM ``pids``, SIGKILL the ones still alive after ``timeout``; return survivors."""
    pids = [p for p in pids if p != os.getpid()]
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 2.0)):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pids)
            pids = [p for p in pids if pid_alive(p)]
            if not pids:
                return []
            time.sleep(0.02)
    return pids


def _reap(pids: list[int]) -> None:
    """Collect exit statuses of any of ``pids`` that are our own children."""
    for p in pids:
        try:
            os.waitpid(p, os.WNOHANG)
        except ChildProcessError:
            pass
