"""Issue 43 prototype (not the agent): receive 1 GiB into tmpfs one of six ways and print the CPU-s (README)."""
import os, sys, socket, mmap, time, blake3
MODE, PORT, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
SIZE = 1 << 30; CH = int(os.environ.get("CH", 1 << 20))
key = b"k" * 32
os.sched_setaffinity(0, {1})
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind(("127.0.0.1", PORT)); ls.listen(1)
print("ready", flush=True)
c, _ = ls.accept()
t0 = os.times(); w0 = time.perf_counter()
fd = os.open(OUT, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
os.environ.get("NOFALLOC") or os.posix_fallocate(fd, 0, SIZE)
h = blake3.blake3(key=key)
got = 0
if MODE == "none":  # iperf-like floor: recv into a buffer
    buf = bytearray(CH); mv = memoryview(buf)
    while got < SIZE:
        n = c.recv_into(mv, min(CH, SIZE - got)); got += n
elif MODE == "recvhash":  # recv + hash, no write
    buf = bytearray(CH); mv = memoryview(buf)
    while got < SIZE:
        n = c.recv_into(mv, min(CH, SIZE - got), socket.MSG_WAITALL); h.update(mv[:n]); got += n
elif MODE == "pump":
    buf = bytearray(CH); mv = memoryview(buf)
    while got < SIZE:
        n = c.recv_into(mv, min(CH, SIZE - got), socket.MSG_WAITALL); h.update(mv[:n]); os.pwrite(fd, mv[:n], got); got += n
elif MODE == "splice":
    r, w = os.pipe(); import fcntl; fcntl.fcntl(w, 1031, CH)
    buf = bytearray(CH); mv = memoryview(buf)
    while got < SIZE:
        n = os.splice(c.fileno(), w, min(CH, SIZE - got))
        m = 0
        while m < n: m += os.splice(r, fd, n - m, offset_dst=got + m)
        k = os.preadv(fd, [mv[:n]], got); h.update(mv[:n]); got += n
elif MODE in ("mmap", "mmappop"):
    while got < SIZE:
        L = min(CH, SIZE - got)
        m = mmap.mmap(fd, L, offset=got)
        if MODE == "mmappop": m.madvise(23 if hasattr(mmap, "MADV_POPULATE_WRITE") else 23, 0, L)  # MADV_POPULATE_WRITE=23
        mv = memoryview(m); n = 0
        while n < L: n += c.recv_into(mv[n:], L - n)
        h.update(mv); mv.release(); m.close(); got += L
t1 = os.times(); w1 = time.perf_counter()
cpu = (t1.user - t0.user) + (t1.system - t0.system)
print(f"{MODE} cpu {cpu:.3f} s/GiB user {t1.user-t0.user:.3f} sys {t1.system-t0.system:.3f} wall {w1-w0:.2f} digest {h.hexdigest()[:12]}", flush=True)
os.unlink(OUT)
