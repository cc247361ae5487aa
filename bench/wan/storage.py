"""Write-rate-capped destination storage: ext4 on a loop device throttled by cgroup-v1 blkio.

The cap is a ``blkio.throttle.write_bps_device`` rule in the root blkio cgroup for our own
loop device, so it throttles every write to that device (including page-cache writeback by
kernel threads). The device's dirty page cache is held to a few MiB (``strict_limit`` +
``max_bytes`` on its bdi), so writers feel the cap within a second, like a slow disk.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from fstream_bench.wan import netns
from fstream_bench.wan.netns import WanError

BLKIO_WRITE = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")
DIRTY_BYTES = 8 << 20


def storage_supported() -> str | None:
    """None if a capped disk can be made here, else the reason it cannot."""
    if not BLKIO_WRITE.exists():
        return (f"{BLKIO_WRITE} is missing: the write cap needs cgroup-v1 blkio throttling "
                "(a cgroup-v2-only host is not supported yet)")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if not _which(tool):
            return f"{tool} is missing (util-linux / e2fsprogs)"
    return None


def _which(tool: str) -> bool:
    from shutil import which

    return which(tool) is not None


def make_disk(image: Path, mountpoint: Path, *, size_bytes: int, write_bps: float) -> dict[str, Any]:
    """Create, mount and cap the disk; return what :func:`remove_disk` needs to undo it."""
    why = storage_supported()
    if why:
        raise WanError(f"destination storage limit: {why}")
    info: dict[str, Any] = {"image": str(image), "mount": str(mountpoint)}
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
        BLKIO_WRITE.write_text(f"{info['majmin']} {int(write_bps / 8)}\n")
        info["write_bps"] = write_bps
    except BaseException:
        remove_disk(info)
        raise
    return info


def _majmin(dev: str) -> str:
    st = os.stat(dev)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def remove_disk(info: dict[str, Any]) -> list[str]:
    """Undo :func:`make_disk` (also for leftovers of a crashed run); return what was removed."""
    removed: list[str] = []
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
    return removed


def _is_mounted(mnt: str) -> bool:
    real = os.path.realpath(mnt)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == real for line in f if len(line.split()) > 1)


def measure_write_bps(path_dir: Path, *, nbytes: int = 48 << 20) -> float:
    """Write ``nbytes`` into ``path_dir`` with fsync and return the rate seen (bits/s)."""
    import time

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
