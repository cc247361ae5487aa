"""Facts and limits of the sending host: the kernel's TCP buffer cap, the descriptor limit."""

from __future__ import annotations

import resource


def tcp_buffer_max() -> int:
    """The kernel's maximum TCP send buffer (what caps one stream at buffer / RTT)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20


def raise_fd_limit() -> None:
    """Raise the soft descriptor limit towards the hard one (many channels × streams × open files)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 16), hard))
        except (ValueError, OSError):
            pass
