"""Batched control frames (issue 29): many OPENs, OPEN_OKs, COMMITs or COMMITTEDs in one frame.

A batch frame is an envelope of per-file frames, ``{"frames": [[type, file_id, body], ...]}`` (header file id 0),
and means exactly what its frames sent one after another would mean: each is handled (and answered) as its own
frame, with its own file id, outcome and error. Which frames an envelope may hold is fixed (``INNER``):

* ``OPEN_BATCH``: OPENs (sender → receiver);
* ``OPEN_OK_BATCH``: the answers to OPENs, OPEN_OK or a per-file ERROR (receiver → sender);
* ``COMMIT_BATCH``: COMMITs (sender → receiver);
* ``COMMITTED_BATCH``: COMMITTEDs, e.g. those of one group commit (receiver → sender).

Negotiated, never assumed: each side lists ``"batch"`` in the capabilities of its HELLO (sender) or CHALLENGE
(receiver), which the handshake's proofs cover; batch frames are sent only on a connection where both sides listed
it (``speaks_batch``, ``send_batched``): an older peer sends and gets single frames, as before. Nothing waits
to fill a batch: a batch holds what was ready when it was sent, and one frame goes as the single frame it is.

Bounded: a batch holds at most ``BATCH_MAX`` frames and, encoded, at most ``BATCH_BYTES`` (so that it still fits
``MAX_CONTROL`` once MAC'd or sealed: base64 adds a third); larger sets go as several batches, and one frame too
large for a batch goes alone. A batch received with too many frames, a frame of a type its envelope may not
hold, a malformed entry or a file id twice is a ``ProtocolError`` naming the problem (the body itself is bounded
by ``MAX_CONTROL`` before it is decoded).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from transfer_agent.errors import ProtocolError
from transfer_agent.wire.protocol import MAX_CONTROL, Frame

BATCH_CAP = "batch"  # the capability: this side sends and understands batch frames
BATCH_MAX = 256  # frames in one batch at most
BATCH_BYTES = MAX_CONTROL // 2  # encoded frames in one batch at most: room for the MAC, or sealing's base64
MAX_FILE_ID = (1 << 32) - 1  # a header's file id is 32 bits
INNER: dict[Frame, frozenset[Frame]] = {
    Frame.OPEN_BATCH: frozenset({Frame.OPEN}),
    Frame.OPEN_OK_BATCH: frozenset({Frame.OPEN_OK, Frame.ERROR}),
    Frame.COMMIT_BATCH: frozenset({Frame.COMMIT}),
    Frame.COMMITTED_BATCH: frozenset({Frame.COMMITTED}),
}
ENVELOPE = {inner: outer for outer, inners in INNER.items() for inner in inners}  # OPEN -> OPEN_BATCH, ...
_HEAD = b'{"frames":['
_TAIL = b"]}"

Sub = tuple[Frame, int, dict[str, Any]]  # one per-file frame: (type, file id, body)
Out = tuple[Frame, "dict[str, Any] | bytes", int]  # a frame to send: (type, body or canonical body, file id)


def _encode(sub: Sub) -> bytes:
    ftype, fid, body = sub
    return json.dumps([int(ftype), fid, body], sort_keys=True, separators=(",", ":")).encode()


def pack(subs: Sequence[Sub], batch: bool = True) -> list[Out]:
    """The frames that carry ``subs`` in order: batches of consecutive frames of one envelope (each body already
    in its canonical encoding, which is what the control link MACs or seals), or, without ``batch``, for a frame
    alone or one too large for a batch, the single frames themselves."""
    out: list[Out] = []
    run: list[bytes] = []  # encoded frames of the batch being filled
    run_type: Frame | None = None
    run_bytes = 0
    run_first: Sub | None = None

    def close() -> None:
        nonlocal run, run_type, run_bytes, run_first
        if len(run) == 1 and run_first is not None:
            out.append((run_first[0], run_first[2], run_first[1]))  # a batch of one is the frame itself
        elif run:
            assert run_type is not None
            out.append((run_type, _HEAD + b",".join(run) + _TAIL, 0))
        run, run_type, run_bytes, run_first = [], None, 0, None

    for sub in subs:
        outer = ENVELOPE.get(sub[0]) if batch else None
        if outer is None:
            close()
            out.append((sub[0], sub[2], sub[1]))
            continue
        enc = _encode(sub)
        if len(enc) > BATCH_BYTES:
            close()
            out.append((sub[0], sub[2], sub[1]))  # alone, under the single frame's limit as ever
            continue
        if outer != run_type or len(run) >= BATCH_MAX or run_bytes + len(enc) + 1 > BATCH_BYTES:
            close()
            run_type = outer
        if not run:
            run_first = sub
        run.append(enc)
        run_bytes += len(enc) + 1
    close()
    return out


def unpack(ftype: Frame, body: dict[str, Any]) -> list[Sub]:
    """The per-file frames of a batch received, checked: at most ``BATCH_MAX``, each ``[type, file id, body]`` of
    a type ``ftype`` may hold, a file id of 1 to 2**32-1 that no other frame of the batch names; else
    ``ProtocolError`` naming the problem."""
    name = ftype.name
    allowed = INNER[ftype]
    types = {int(a) for a in allowed}
    frames = body.get("frames")
    if not isinstance(frames, list):
        raise ProtocolError(f"malformed {name} frame: no list of frames")
    if not frames:
        raise ProtocolError(f"malformed {name} frame: no frames in it")
    if len(frames) > BATCH_MAX:
        raise ProtocolError(f"{name} frame of {len(frames)} frames refused (at most {BATCH_MAX} in one batch)")
    out: list[Sub] = []
    seen: set[int] = set()
    for i, entry in enumerate(frames):
        if not isinstance(entry, list) or len(entry) != 3:
            raise ProtocolError(f"malformed {name} frame: entry {i} is not [type, file id, body]")
        t, fid, sub = entry
        if not isinstance(t, int) or isinstance(t, bool) or t not in types:
            raise ProtocolError(f"malformed {name} frame: entry {i} has type {t!r}; a {name} holds only "
                                f"{' and '.join(sorted(a.name for a in allowed))} frames")
        if not isinstance(fid, int) or isinstance(fid, bool) or not 1 <= fid <= MAX_FILE_ID:
            raise ProtocolError(f"malformed {name} frame: entry {i} has file id {fid!r} (not 1 to {MAX_FILE_ID})")
        if fid in seen:
            raise ProtocolError(f"malformed {name} frame: file id {fid} appears twice in one batch")
        if not isinstance(sub, dict):
            raise ProtocolError(f"malformed {name} frame: entry {i} (file id {fid}) has a body that is not an object")
        seen.add(fid)
        out.append((Frame(t), fid, sub))
    return out


def speaks_batch(link: Any) -> bool:
    """Whether both ends of ``link`` listed the ``batch`` capability in its handshake."""
    return BATCH_CAP in getattr(link, "caps", ()) and BATCH_CAP in getattr(link, "peer_caps", ())


def send_batched(link: Any, subs: Iterable[Sub]) -> list[Out]:
    """Send ``subs`` on ``link`` (a ``ControlLink``; MAC'd or sealed frame by frame) in one write: batched when the
    peer speaks batch, else as single frames. Returns the frames sent (callers count the batches)."""
    out = pack(list(subs), speaks_batch(link))
    if out:
        link.send_frames(out)
    return out
