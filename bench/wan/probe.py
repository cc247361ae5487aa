"""TCP round-trip probe run inside a namespace: an echo server and a client timing connects and echoes."""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time


def serve(host: str, port: int) -> None:
    """Echo every byte back on every connection until killed; print ``listening`` when ready."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port))
    ls.listen(64)
    print("listening", flush=True)
    while True:
        conn, _ = ls.accept()
        threading.Thread(target=_echo, args=(conn,), daemon=True).start()


def _echo(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def measure(host: str, port: int, count: int) -> dict:
    """Time ``count`` TCP connects (SYN/SYN-ACK) and ``count`` 64-byte echo round trips."""
    connect_ms = []
    for _ in range(count):
        t0 = time.perf_counter()
        s = socket.create_connection((host, port), timeout=10)
        connect_ms.append((time.perf_counter() - t0) * 1e3)
        s.close()
    echo_ms = []
    with socket.create_connection((host, port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = b"x" * 64
        for _ in range(count):
            t0 = time.perf_counter()
            s.sendall(msg)
            got = 0
            while got < len(msg):
                chunk = s.recv(len(msg) - got)
                if not chunk:
                    raise ConnectionError(f"echo server {host}:{port} closed the connection")
                got += len(chunk)
            echo_ms.append((time.perf_counter() - t0) * 1e3)
    return {"connect_ms": connect_ms, "echo_ms": echo_ms,
            "echo_median_ms": statistics.median(echo_ms),
            "connect_median_ms": statistics.median(connect_ms)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fstream_bench.wan.probe")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, required=True)
    m = sub.add_parser("rtt")
    m.add_argument("--host", required=True)
    m.add_argument("--port", type=int, required=True)
    m.add_argument("--count", type=int, default=20)
    a = ap.parse_args(argv)
    if a.cmd == "serve":
        serve(a.host, a.port)
        return 0
    json.dump(measure(a.host, a.port, a.count), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
