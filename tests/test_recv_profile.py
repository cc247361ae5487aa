"""``fstream bench recv-profile`` (issue 43): a sample's stage comes from its stack, the leaf-most named frame
deciding; perf's own output parses; a real ``perf record`` of a loopback TCP receiver puts its samples in the
socket-copy stage."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from fstream_bench.datapath import recv_profile as rp

# the shape ``perf script -F comm,pid,tid,ip,sym,dso`` prints (frame names as this machine's kernel has them)
SCRIPT = """\
fstream 4242/4250 
\tffffffff81c3a1b0 rep_movs_alternative ([kernel.kallsyms])
\tffffffff81a2c8f1 skb_splice_bits ([kernel.kallsyms])
\tffffffff81b0e2a2 tcp_splice_read ([kernel.kallsyms])
\tffffffff8170a4c1 __x64_sys_splice ([kernel.kallsyms])
\t           5e2a1 splice (/usr/lib/x86_64-linux-gnu/libc.so.6)

fstream 4242/4251 
\tffffffff81b3c001 tcp_v4_rcv ([kernel.kallsyms])
\tffffffff81a5e0a0 net_rx_action ([kernel.kallsyms])
\tffffffff8170a4c1 __x64_sys_splice ([kernel.kallsyms])

python3.11 4242/4242 
\t           2f3a0 blake3_hash_many_avx2 (/work/x/fstream_native.cpython-311-x86_64-linux-gnu.so)
\t           1a000 fstream_native::tree::feed (/work/x/fstream_native.cpython-311-x86_64-linux-gnu.so)

python3.11 4242/4242 
\t          1d2c3b _PyEval_EvalFrameDefault (/usr/bin/python3.11)

fstream 4242/4252 
\tffffffff81c3a1b0 _raw_spin_unlock_irq ([kernel.kallsyms])
\tffffffff8160f000 shmem_alloc_and_add_folio ([kernel.kallsyms])
\tffffffff8160f100 shmem_fallocate ([kernel.kallsyms])
\tffffffff8160f200 vfs_fallocate ([kernel.kallsyms])
\tffffffff8160f300 __x64_sys_fallocate ([kernel.kallsyms])

iperf3 777/777 
\tffffffff81c3a1b0 rep_movs_alternative ([kernel.kallsyms])
\tffffffff81a2d0e0 skb_copy_datagram_iter ([kernel.kallsyms])
\tffffffff81b0f100 tcp_recvmsg_locked ([kernel.kallsyms])
\tffffffff81b0f300 tcp_recvmsg ([kernel.kallsyms])
\tffffffff8170b000 __x64_sys_read ([kernel.kallsyms])

iperf3 777/777 
\tffffffff81c3a1b0 some_kernel_thing ([kernel.kallsyms])
"""


def test_stage_from_the_leaf_most_named_frame():
    samples = rp.parse_script(SCRIPT)
    assert [(c, p) for c, p, _ in samples] == [("fstream", 4242), ("fstream", 4242), ("python3.11", 4242),
                                               ("python3.11", 4242), ("fstream", 4242), ("iperf3", 777),
                                               ("iperf3", 777)]
    stages = [rp.stage_of(frames) for _, _, frames in samples]
    assert stages == ["socket → pipe (splice)", "TCP/IP receive processing", "BLAKE3 (keyed hash)",
                      "Python interpreter", "page allocation (fallocate at OPEN)", "socket → memory (recv/read copy)", "other kernel"]
    counts, folded = rp._stages(samples, lambda comm, pid: pid == 4242)
    assert sum(counts.values()) == 5 and counts["socket → pipe (splice)"] == 1
    assert folded["fstream;splice;__x64_sys_splice;tcp_splice_read;skb_splice_bits;rep_movs_alternative"] == 1


def test_summary_prices_each_stage_by_its_share_of_the_cpu():
    runs = [{"tool": "fstream", "cpu_s_per_gb": 2.0, "gbit_s": 8.0, "samples": 100,
             "stages": {"a": 75, "b": 25}},
            {"tool": "fstream", "cpu_s_per_gb": 4.0, "gbit_s": 6.0, "samples": 10, "stages": {"a": 5, "b": 5}}]
    s = rp.summarize(runs)["fstream"]
    assert s["cpu_s_per_gb"] == {"median": 3.0, "min": 2.0, "max": 4.0}
    assert s["stages"] == {"a": pytest.approx((1.5 + 2.0) / 2), "b": pytest.approx((0.5 + 2.0) / 2)}


def _perf_works() -> str | None:
    if shutil.which("perf") is None:
        return "perf is not installed"
    probe = subprocess.run(["perf", "record", "-o", "/dev/null", "-q", "--", "true"], capture_output=True)
    return None if probe.returncode == 0 else f"perf record refused: {probe.stderr.decode()[-200:]}"


def test_a_real_tcp_receiver_lands_in_the_socket_copy_stage(tmp_path):
    why = _perf_works()
    if why:
        pytest.skip(why)
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    reader = subprocess.Popen([sys.executable, "-c", (
        "import socket,sys\n"
        f"c=socket.create_connection(('127.0.0.1',{port}));b=bytearray(1<<20);n=0\n"
        "while True:\n k=c.recv_into(b)\n if not k: break\n n+=k\n"
        "print(n)")], stdout=subprocess.PIPE, text=True)
    conn, _ = srv.accept()
    data = tmp_path / "perf.data"
    perf = subprocess.Popen(["perf", "record", "-g", "-F", "1999", "-p", str(reader.pid), "-o", str(data)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # perf attached before the bytes flow
        block = b"x" * (1 << 20)
        sender = threading.Thread(target=lambda: [conn.sendall(block) for _ in range(3000)])
        sender.start()
        sender.join()
        conn.close()
        assert int(reader.communicate(timeout=60)[0]) == 3000 << 20
    finally:
        perf.send_signal(2)
        perf.wait(30)
        srv.close()
    text = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,sym,dso"],
                          capture_output=True, text=True, check=True).stdout
    counts, _ = rp._stages(rp.parse_script(text), lambda comm, pid: pid == reader.pid)
    assert sum(counts.values()) > 20, counts
    top = counts.most_common(1)[0][0]
    assert top == "socket → memory (recv/read copy)", counts
