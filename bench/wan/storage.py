"""Write-rate-capped destination storage: ext4 on a loop device throttled by cgroup blkio/io.

The device's dirty page cache is held to a few MiB (``strict_limit`` + ``max_bytes`` on its bdi), so
writers feel the cap within a second, like a slow disk. The cap itself:

- cgroup v1 (``/sys/fs/cgroup/blkio`` mounted): a ``blkio.throttle.write_bps_device`` rule in the root
  blkio cgroup for our loop device throttles every write to it, whoever writes (including page-cache
  writeback by kernel threads).
- cgroup v2 (no v1 blkio): a root cgroup takes no ``io.max``, so the cap is ``io.max`` (``MAJ:MIN
  wbps=N``) in a child cgroup ``fswan-<mount name>`` (``fswan-<run id>-dstdisk``) of the v2 root, with
  ``io`` and ``memory`` enabled in the root's ``cgroup.subtree_control``, and it caps the processes in
  that cgroup: :meth:`WanPath.exec <fstream_bench.wan.path.WanPath.exec>` / ``run`` put what they start in
  the destination namespace there (:func:`in_cgroup_argv`), :func:`measure_write_bps` its probe. Buffered
  writes are charged to the cgroup that dirtied the pages only when both ``memory`` and ``io`` are on
  cgroup v2 (cgroup writeback), so a host with ``io`` but not ``memory`` on v2 is refused.
  :func:`remove_disk` moves what is left in the cgroup back to its parent and removes it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fstream_bench.wan import netns
from fstream_bench.wan.netns import WanError

CGROUP_ROOT = Path("/sys/fs/cgroup")
BLKIO_WRITE = CGROUP_ROOT / "blkio" / "blkio.throttle.write_bps_device"
CGROUP_PREFIX = "fswan-"
#: the child cgroup of a run's disk, by its mount point's name (``<run id>-dstdisk``)
CGROUP_RE = re.compile(r"^fswan-([a-z0-9]{1,10})-dstdisk$")
DIRTY_BYTES = 8 << 20
TOOLS = ("losetup", "mkfs.ext4", "mount", "umount")


def cgroup2_root() -> Path | None:
    """Where the cgroup-v2 hierarchy is mounted (``/sys/fs/cgroup``; ``.../unified`` on a hybrid host)."""
    try:
        with open("/proc/mounts") as f:
            found = [Path(parts[1]) for parts in (line.split() for line in f)
                     if len(parts) > 2 and parts[2] == "cgroup2"]
    except OSError:
        return None
    return CGROUP_ROOT if CGROUP_ROOT in found else (found[0] if found else None)


def throttle_mode() -> tuple[str | None, str]:
    """``("v1", "")`` or ``("v2", "")``: how this host caps the disk; ``(None, why)`` if it cannot."""
    if BLKIO_WRITE.exists():
        return "v1", ""
    root = cgroup2_root()
    if root is None:
        return None, f"{BLKIO_WRITE} is missing and no cgroup-v2 hierarchy is mounted: no block I/O throttling"
    try:
        controllers = (root / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return None, f"cannot read {root / 'cgroup.controllers'}: {exc}"
    if "io" not in controllers:
        return None, (f"{BLKIO_WRITE} is missing and the io controller is not on cgroup v2 either "
                      f"({root}/cgroup.controllers: {' '.join(controllers) or 'none'})")
    if "memory" not in controllers:
        return None, (f"the io controller is on cgroup v2 ({root}) but the memory controller is not: page-cache "
                      "writeback is charged to the writer's cgroup only when both are, so io.max would not "
                      "cap buffered writes")
    if not os.access(root / "cgroup.subtree_control", os.W_OK):
        return None, f"{root} is not writable here (a container without cgroup delegation?)"
    enabled = (root / "cgroup.subtree_control").read_text().split()
    if ((root / "cgroup.type").exists() and not {"io", "memory"} <= set(enabled)
            and (root / "cgroup.procs").read_text().split()):
        # not the real root (only that has no cgroup.type): a cgroup holding processes itself cannot
        # enable controllers for its children
        return None, (f"{root} is a cgroup namespace's root that holds processes itself, so it cannot enable "
                      "io and memory for a child cgroup (move its processes into a child cgroup first)")
    return "v2", ""


def missing_tools() -> list[str]:
    """The programs a capped disk needs that are not installed (util-linux, e2fsprogs)."""
    return [t for t in TOOLS if not _which(t)]


def storage_supported() -> str | None:
    """None if a capped disk can be made here, else the reason it cannot."""
    mode, why = throttle_mode()
    if mode is None:
        return why
    for tool in missing_tools():
        return f"{tool} is missing (util-linux / e2fsprogs)"
    return None


def _which(tool: str) -> bool:
    from shutil import which

    return which(tool) is not None


def make_disk(image: Path, mountpoint: Path, *, size_bytes: int, write_bps: float) -> dict[str, Any]:
    """Create, mount and cap the disk; return what :func:`remove_disk` needs to undo it.

    On cgroup v2 the returned ``cgroup`` is the directory of the child cgroup whose processes are capped.
    """
    why = storage_supported()
    if why:
        raise WanError(f"destination storage limit: {why}")
    mode, _ = throttle_mode()
    info: dict[str, Any] = {"image": str(image), "mount": str(mountpoint), "throttle": mode}
    try:
        with open(image, "wb") as f:
            f.truncate(size_bytes)  # sparse: costs no space until written
        info["loop"] = netns.run(["losetup", "--find", "--show", str(image)]).stdout.strip()
        netns.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1",
                   info["loop"]], timeout=120)
        mountpoint.mkdir(parents=True, exist_ok=True)
        # noinit_itable: no background inode-table zeroing eating the capped bandwidth
        netns.run(["mount", "-o", "noatime,noinit_itable", info["loop"], str(mountpoint)])
        info["mounted"] = True
        info["majmin"] = _majmin(info["loop"])
        bdi = Path("/sys/class/bdi") / info["majmin"]
        for knob, value in (("strict_limit", "1"), ("max_bytes", str(DIRTY_BYTES))):
            if (bdi / knob).exists():
                (bdi / knob).write_text(value)
        if mode == "v1":
            BLKIO_WRITE.write_text(f"{info['majmin']} {int(write_bps / 8)}\n")
        else:
            cgroup = disk_cgroup(info)
            assert cgroup is not None  # a v2 host has a v2 root
            info["cgroup"] = str(cgroup)  # before it exists: a failure below removes it
            _cap_in_cgroup(cgroup, info["majmin"], int(write_bps / 8))
        info["write_bps"] = write_bps
    except BaseException:
        remove_disk(info)
        raise
    return info


def disk_cgroup(info: dict[str, Any]) -> Path | None:
    """The cgroup-v2 directory that caps the disk ``info`` describes (None without a v2 hierarchy).

    Named after the mount point, so a crashed run's cgroup is found without its state file.
    """
    if info.get("cgroup"):
        return Path(info["cgroup"])
    root = cgroup2_root()
    return root / f"{CGROUP_PREFIX}{Path(info['mount']).name}" if root and info.get("mount") else None


def _cap_in_cgroup(cgroup: Path, majmin: str, bytes_per_s: int) -> None:
    """Make ``cgroup`` (a child of the v2 root) and cap writes to ``majmin`` in it with ``io.max``."""
    root = cgroup.parent
    enabled = (root / "cgroup.subtree_control").read_text().split()
    for controller in ("memory", "io"):  # both: writeback is charged to the dirtying cgroup only then
        if controller not in enabled:
            try:
                (root / "cgroup.subtree_control").write_text(f"+{controller}\n")
            except OSError as exc:
                raise WanError(f"cannot enable the {controller} controller in {root}/cgroup.subtree_control "
                               f"({exc}); a cgroup that holds processes itself cannot delegate controllers "
                               "(inside a container, run its processes in a child cgroup)") from exc
    cgroup.mkdir(exist_ok=True)
    rule = f"{majmin} wbps={bytes_per_s}"
    try:
        (cgroup / "io.max").write_text(rule + "\n")
    except OSError as exc:
        raise WanError(f"{cgroup}/io.max refused {rule!r}: {exc}") from exc
    if not any(line.startswith(f"{majmin} ") and f"wbps={bytes_per_s}" in line
               for line in (cgroup / "io.max").read_text().splitlines()):
        raise WanError(f"{cgroup}/io.max does not hold {rule!r} after writing it")


def in_cgroup_argv(cgroup: str | Path, argv: list[str]) -> list[str]:
    """``argv`` run by a shell that first moves itself into ``cgroup``, then execs it (same pid)."""
    return ["sh", "-c", 'echo $$ > "$1/cgroup.procs" || exit 126; shift; exec "$@"', "fswan-join",
            str(cgroup), *argv]


def remove_cgroup(cgroup: Path, *, timeout: float = 5.0) -> bool:
    """Move every process left in ``cgroup`` to its parent and remove it; True if it existed."""
    if not cgroup.is_dir():
        return False
    deadline = time.monotonic() + timeout
    while True:
        try:
            pids = (cgroup / "cgroup.procs").read_text().split()
        except FileNotFoundError:
            return True
        for pid in pids:
            try:
                (cgroup.parent / "cgroup.procs").write_text(pid + "\n")
            except OSError:
                pass  # it exited meanwhile
        try:
            cgroup.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:  # EBUSY while an exiting process still counts
            if time.monotonic() > deadline:
                raise WanError(f"cannot remove cgroup {cgroup} (processes {' '.join(pids) or 'none'} could not "
                               f"be moved to {cgroup.parent}): {exc}") from exc
            time.sleep(0.05)


def _majmin(dev: str) -> str:
    st = os.stat(dev)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def remove_disk(info: dict[str, Any]) -> list[str]:
    """Undo :func:`make_disk` (also for leftovers of a crashed run); return what was removed.

    The cgroup of a v2 cap is removed even when an earlier step fails.
    """
    removed: list[str] = []
    try:
        _remove_disk(info, removed)
    finally:
        cgroup = disk_cgroup(info)
        ours = cgroup is not None and (CGROUP_RE.match(cgroup.name) or (
            info.get("cgroup") and cgroup.name.startswith(CGROUP_PREFIX)))  # only names this testbed gives
        if ours and remove_cgroup(cgroup):
            removed.append(f"cgroup {cgroup}")
    return removed


def _remove_disk(info: dict[str, Any], removed: list[str]) -> None:
    image, mnt = info.get("image"), info.get("mount")
    if mnt and _is_mounted(mnt):
        netns.run(["umount", mnt])
        removed.append(f"mount {mnt}")
    loops = [info["loop"]] if info.get("loop") else []
    if image:
        out = netns.run(["losetup", "-j", image], check=False).stdout
        loops += [line.split(":", 1)[0] for line in out.splitlines() if line.strip()]
    for loop in dict.fromkeys(loops):
        if not os.path.exists(loop):
            continue
        backing = netns.run(["losetup", "-nO", "BACK-FILE", loop], check=False).stdout.strip()
        if image and backing and os.path.realpath(backing) != os.path.realpath(image):
            continue  # the loop number was reused by someone else: not ours
        majmin = _majmin(loop)
        if BLKIO_WRITE.exists() and re.search(rf"^{majmin} ", BLKIO_WRITE.read_text(), re.M):
            BLKIO_WRITE.write_text(f"{majmin} 0\n")
        netns.run(["losetup", "-d", loop], check=False)
        removed.append(f"loop device {loop}")
    if mnt and os.path.isdir(mnt) and not _is_mounted(mnt):
        try:
            os.rmdir(mnt)
        except OSError:
            pass
    if image and os.path.exists(image):
        os.unlink(image)
        removed.append(f"disk image {image}")


def leftover_cgroups() -> dict[str, Path]:
    """Run id -> cgroup-v2 directory of every disk cap cgroup on this machine (``down --all``)."""
    root = cgroup2_root()
    found: dict[str, Path] = {}
    if root is not None and root.is_dir():
        for d in root.iterdir():
            m = CGROUP_RE.match(d.name)
            if m and d.is_dir():
                found[m.group(1)] = d
    return found


def _is_mounted(mnt: str) -> bool:
    real = os.path.realpath(mnt)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == real for line in f if len(line.split()) > 1)


_PROBE = ("import sys; from pathlib import Path; from fstream_bench.wan.storage import measure_write_bps; "
          "print(measure_write_bps(Path(sys.argv[1]), nbytes=int(sys.argv[2])))")


def measure_write_bps(path_dir: Path, *, nbytes: int = 48 << 20, cgroup: str | Path | None = None) -> float:
    """Write ``nbytes`` into ``path_dir`` with fsync and return the rate seen (bits/s).

    :param cgroup: write from a process in this cgroup (a v2 cap, ``WanPath.disk_cgroup``), not from this one.
    """
    if cgroup is not None:
        cp = subprocess.run(in_cgroup_argv(cgroup, [sys.executable, "-c", _PROBE, str(path_dir), str(nbytes)]),
                            capture_output=True, text=True, timeout=600)
        if cp.returncode != 0:
            raise WanError(f"write probe in cgroup {cgroup} failed (exit {cp.returncode}): {cp.stderr.strip()}")
        return float(cp.stdout.split()[-1])
    target = path_dir / ".fswan-write-probe"
    block = b"\0" * (1 << 20)
    t0 = time.monotonic()
    try:
        with open(target, "wb") as f:
            for _ in range(nbytes // len(block)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        return nbytes * 8 / (time.monotonic() - t0)
    finally:
        target.unlink(missing_ok=True)
        subprocess.run(["sync", "-f", str(path_dir)], check=False)
