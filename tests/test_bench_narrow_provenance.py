"""Issue 42, "provenance at the grain of what ran": a result hashes the files its processes imported.

A real ``fstream receive`` and ``fstream send`` run under ``provenance.start``/``finish``. Python's own
import log (``PYTHONPROFILEIMPORTTIME``, written by the interpreter, not by our recorder) names every
module each process imported: every one of ours is among the result's ``files``, so a change to any of
them changes the hash (checked on a copy of those files). Modules the transfer never ran (SIGHUP's
reload, the deadline tuner, HARP) are not among them, so changing them cannot stale the result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fstream_bench.core import provenance
from agentkit import make_files, write_secret

FSTREAM = str(Path(sys.executable).with_name("fstream"))
IMPORTTIME = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)\s*$")


def _imported(log: Path) -> set[str]:
    """Our modules a process imported, as the interpreter's ``-X importtime`` log names them."""
    names = {m.group(1) for line in log.read_text(errors="replace").splitlines() if (m := IMPORTTIME.match(line))}
    return {n for n in names if n.partition(".")[0] in provenance.ROOTS}


RUN = """
import json, os, subprocess, sys
from pathlib import Path
from fstream_bench.core import provenance
work, fstream = Path(sys.argv[1]), sys.argv[2]
prov = provenance.start("narrow-probe", [], ["transfer_agent"])
env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
with open(work / "rx.err", "w") as err:
    rx = subprocess.Popen([fstream, "receive", "--listen", "127.0.0.1:0", "--root", str(work / "dst"),
                           "--secret-file", str(work / "secret"), "--no-fsync"], stdout=subprocess.PIPE,
                          stderr=err, text=True, env=env)
try:
    line = rx.stdout.readline()
    assert line.startswith("listening on "), line
    with open(work / "tx.err", "w") as err:
        done = subprocess.run([fstream, "send", str(work / "src"), "--to",
                               "fstream://127.0.0.1:%d/out" % int(line.rsplit(":", 1)[1]),
                               "--secret-file", str(work / "secret"), "--tuner", "fixed", "--cc", "2", "--p", "1",
                               "--pp", "2"], stdout=subprocess.DEVNULL, stderr=err, env=env, timeout=120)
    assert done.returncode == 0, (work / "tx.err").read_text()[-2000:]
finally:
    rx.terminate()
    rx.wait(20)
prov = provenance.finish(prov)
print(json.dumps({"prov": prov, "left": provenance.RECORD_ENV in os.environ}))
"""


@pytest.fixture(scope="module")
def transfer(tmp_path_factory):
    """One real send over loopback (fixed tuner, as §12's loopback rows), recorded by a benchmark-like process of
    its own (this test process has imported far more than a benchmark would); the import logs of both sides."""
    work = tmp_path_factory.mktemp("narrow")
    write_secret(work / "secret")
    make_files(work / "src", {"a.dat": 300_000, "b.dat": 5, "sub/c.dat": 70_000})
    env = {k: v for k, v in os.environ.items() if k not in (provenance.RECORD_ENV, "PYTHONPATH")}
    done = subprocess.run([sys.executable, "-c", RUN, str(work), FSTREAM], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (work / "dst" / "out" / "sub" / "c.dat").stat().st_size == 70_000
    assert not out["left"]  # finished: nothing left recording
    return out["prov"], _imported(work / "rx.err"), _imported(work / "tx.err")


def test_every_module_either_side_imported_is_hashed(transfer):
    prov, rx, tx = transfer
    assert "transfer_agent.receiving.data" in rx and "transfer_agent.sending.channel" in tx  # the logs are real
    files = set(prov["files"])
    missing = {name: p for name in rx | tx for p in provenance._module_files(name)
               if p.resolve().relative_to(provenance.REPO).as_posix() not in files}
    assert not missing, f"imported but not hashed: {sorted(missing)}"
    assert prov["code_hash"] == provenance.files_hash(prov["files"])
    assert "record" not in prov


def test_code_the_transfer_never_ran_is_not_hashed(transfer):
    prov, rx, tx = transfer
    for never in ("transfer_agent/cli/reload.py", "fstream_provider/tuning/deadline.py",
                  "fstream_provider/tuning/harp.py"):
        assert never not in prov["files"], never
    assert "transfer_agent/receiving/data.py" in prov["files"]
    assert any(f.startswith("native/src/") for f in prov["files"]) == ("transfer_agent.storage._blake3tree" in rx | tx)


def test_a_change_to_a_file_that_ran_changes_the_hash_and_a_docstring_does_not(transfer, tmp_path):
    prov, _, _ = transfer
    for rel in prov["files"]:
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(provenance.REPO / rel, dst)
    assert provenance.files_hash(prov["files"], tmp_path) == prov["code_hash"]
    data = tmp_path / "transfer_agent/receiving/data.py"
    text = data.read_text()
    data.write_text(text.replace('"""', '"""Reworded. ', 1) + "\n# a comment\n")
    assert provenance.files_hash(prov["files"], tmp_path) == prov["code_hash"]
    data.write_text(text + "\nNEW_LIMIT = 1\n")
    assert provenance.files_hash(prov["files"], tmp_path) != prov["code_hash"]
    data.unlink()
    with pytest.raises(LookupError, match="receiving/data.py no longer exists"):
        provenance.files_hash(prov["files"], tmp_path)
