"""The receiving side: the listener, control sessions, data streams and the commit path.

``receiver.Receiver`` is built in layers, one module each, each importing only the ones below it:

- ``receiver``: the listener (accept loop, pre-auth caps and deadlines, handshake, session teardown, lifecycle,
  the flush and sweep schedule);
- ``control``: a session's control connection (OPEN with validation, fencing and resumption, COMMIT, ABORT/SKIP);
- ``data``: its data connections (splice or recv_into + pwrite, sealed blocks, dropped blocks of given-up files);
- ``commit``: group commit (verify, concurrent fdatasync, renames, one fsync per directory);
- ``store``: the parts (claims, current attempts, parent directories, ranges sidecars, removal, orphan sweep);
- ``state``: ``Session`` and ``RecvFile``, what the receiver knows of each sender and file;
- ``admission``: the budget of open parts from the descriptor limit, and the OPENs parked beyond it (backpressure,
  issue 43), used by ``store`` (a released part frees a slot) and ``control`` (an OPEN takes one or waits);
- ``claims``: which session holds which part (``store``'s table; across processes a record lock);
- several processes behind one port (issue 43): ``router`` (accept, route by the HELLO, hand over) and ``handoff``
  (the hand-over, and ``HandoffReceiver``: a ``Receiver`` whose connections come from its router).
"""
