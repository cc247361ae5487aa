"""A host's TCP facts for ``fstream doctor`` (issue 30): buffer and congestion sysctls, TCP_INFO, MTUs.

Both ends report the same facts (the sender for itself, the receiver in answer to a doctor's ``FACTS``), read
from the kernel of the network namespace the process runs in. Reading never fails: what cannot be read is None.
``readable`` is the one wait both ends of a doctor probe use (poll, so any descriptor number works; TLS-aware).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import select
import socket
import ssl
import struct
import time
from typing import Any

#: What limits one stream (buffers), how it probes (congestion control, queueing) and the MTU behaviour.
SYSCTLS = ("net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
           "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_available_congestion_control",
           "net.core.default_qdisc", "net.ipv4.tcp_mtu_probing", "net.ipv4.tcp_window_scaling",
           "net.ipv4.tcp_no_metrics_save")
SIOCGIFADDR = 0x8915
SIOCGIFMTU = 0x8921
IP_MTU = getattr(socket, "IP_MTU", 14)
IPV6_MTU = getattr(socket, "IPV6_MTU", 24)
# struct tcp_info up to tcpi_total_retrans: 8 one-byte fields, then 24 u32 (linux/tcp.h)
_TCP_INFO = struct.Struct("8B24I")
_TI = {"snd_mss": 10, "rcv_mss": 11, "pmtu": 21, "rtt_us": 23, "rttvar_us": 24, "snd_cwnd": 26,
       "advmss": 27, "total_retrans": 31}


def sysctls(names: tuple[str, ...] = SYSCTLS) -> dict[str, str | None]:
    """``/proc/sys`` values by dotted name, whitespace collapsed (``"4096 131072 6291456"``); None: unreadable."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            with open("/proc/sys/" + name.replace(".", "/")) as f:
                out[name] = " ".join(f.read().split())
        except OSError:
            out[name] = None
    return out


def tcp_info(sock: Any) -> dict[str, int] | None:
    """The kernel's view of a connection: smoothed RTT (µs), MSS, path MTU, cwnd, retransmits; None if unknown."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    except (OSError, AttributeError, ValueError):
        return None
    if len(raw) < _TCP_INFO.size:
        return None
    fields = _TCP_INFO.unpack(raw)
    return {name: fields[i] for name, i in _TI.items()}


def _ifreq(name: str, request: int) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            return fcntl.ioctl(s.fileno(), request, struct.pack("16s24x", name.encode()[:15]))
        except OSError:
            return None


def interface_mtu(name: str) -> int | None:
    """The MTU of interface ``name`` in this network namespace (SIOCGIFMTU)."""
    raw = _ifreq(name, SIOCGIFMTU)
    return struct.unpack_from("i", raw, 16)[0] if raw else None


def interface_of(ip: str) -> str | None:
    """The name of the interface holding address ``ip`` (an IPv4 primary address, or any IPv6 one)."""
    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if isinstance(addr, ipaddress.IPv6Address):
        try:
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 6 and bytes.fromhex(parts[0]) == addr.packed:
                        return parts[5]
        except (OSError, ValueError):
            return None
        return None
    try:
        names = [name for _idx, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        raw = _ifreq(name, SIOCGIFADDR)
        if raw and raw[20:24] == addr.packed:
            return name
    return None


def route_mtu(sock: Any) -> int | None:
    """The MTU of the route a connected socket uses (the path MTU the kernel knows: IP_MTU)."""
    try:
        v6 = sock.family == socket.AF_INET6
        return sock.getsockopt(socket.IPPROTO_IPV6 if v6 else socket.IPPROTO_IP, IPV6_MTU if v6 else IP_MTU)
    except (OSError, AttributeError):
        return None


def connection_facts(sock: Any) -> dict[str, Any]:
    """The interface a connection uses on this host, its MTU, the route's MTU and the kernel's TCP_INFO."""
    try:
        local = str(sock.getsockname()[0])
    except OSError:
        local = ""
    iface = interface_of(local) if local else None
    return {"interface": iface, "interface_mtu": interface_mtu(iface) if iface else None,
            "route_mtu": route_mtu(sock), "tcp_info": tcp_info(sock)}


def host_facts(sock: Any) -> dict[str, Any]:
    """Everything ``fstream doctor`` compares on one end: sysctls, the connection's MTUs and TCP_INFO, the clock."""
    return {"sysctl": sysctls(), **connection_facts(sock), "clock": time.time()}


def free_space(path: str) -> dict[str, int] | None:
    """Bytes free (for an unprivileged writer) and in total on the filesystem holding ``path``."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return {"free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize}


def readable(conn: socket.socket, timeout: float) -> bool:
    """True when ``conn`` has something to read within ``timeout`` seconds (TLS: a record already decrypted, too)."""
    if isinstance(conn, ssl.SSLSocket) and conn.pending():
        return True
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
    try:
        return bool(poller.poll(int(timeout * 1000)))
    except (OSError, ValueError):
        return False
