"""Optional coverage-guided fuzzing with atheris (``pip install atheris``): frame reader and path validator.

Run: ``python bench/ops/fuzz.py -atheris_runs=100000``. Only ``ProtocolError``/``NetworkError`` may
escape ``recv_frame`` and only ``RefusedError`` ``safe_relpath``; anything else is a crash atheris reports.
Not collected by pytest; skipped (exit 0 with a note) when atheris is absent.
"""

from __future__ import annotations

import socket
import sys


def _one(data: bytes) -> None:
    from transfer_agent.errors import NetworkError, ProtocolError, RefusedError
    from transfer_agent.storage.paths import safe_relpath
    from transfer_agent.wire.protocol import recv_frame

    a, b = socket.socketpair()
    try:
        a.sendall(data[:65536])
        a.shutdown(socket.SHUT_WR)
        for _ in range(1000):
            try:
                recv_frame(b)
            except (ProtocolError, NetworkError):
                break
    finally:
        a.close()
        b.close()
    try:
        safe_relpath(data.decode("utf-8", "surrogateescape"))
    except RefusedError:
        pass


def main() -> int:
    try:
        import atheris
    except ImportError:
        print("atheris is not installed; skipping (pip install atheris)", file=sys.stderr)
        return 0
    atheris.instrument_all()
    atheris.Setup(sys.argv, _one)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
