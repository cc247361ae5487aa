"""Issue 43 prototype (not the agent): send 1 GiB of one random MiB repeated to recv.py, pinned to CPU 0."""
import os, sys, socket
os.sched_setaffinity(0, {0})
PORT = int(sys.argv[1]); SIZE = 1 << 30; CH = 1 << 20
s = socket.create_connection(("127.0.0.1", PORT))
import random
buf = bytes(random.Random(1).randbytes(CH)); sent = 0
while sent < SIZE: s.sendall(buf); sent += CH
s.close()
