"""The Airflow part of ``fstream demo``: an LCLS-like run streamed by the ``fstream_lcls_stream`` DAG under ``dag.test()``.

Everything runs on this machine: a private Redis, a receiver and an agent on loopback (threads), and
Airflow with a throw-away ``AIRFLOW_HOME`` and sqlite database (a subprocess, so this process' Airflow
configuration is untouched). A writer thread plays the instrument: it writes detector files while the
stream runs. The demo prints the task log an operator would read (one line per interval, the summary
table, warnings) and the path of the throughput plot. No Airflow import at module level.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

_RUN_DAG = r"""
import json, os, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
dag_id, conf = sys.argv[1], json.loads(sys.argv[2])
bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
if bag.import_errors:
    raise SystemExit(f"example DAGs failed to import: {bag.import_errors}")
dr = bag.dags[dag_id].test(run_conf=conf)
out = {"state": str(dr.state), "xcom": {}}
with create_session() as s:
    for x in s.query(XComModel).filter(XComModel.run_id == dr.run_id, XComModel.dag_id == dag_id):
        out["xcom"][x.task_id + ":" + x.key] = x.value
print("RESULT_JSON " + json.dumps(out, default=str), flush=True)
"""

# the operator's lines and the transfer trigger's live lines (Airflow shows both in the task log)
_TASK_LINE = re.compile(r"\[(?:info|warning|error)\s*\]\s(.*?)\s+"
                        r"\[(?:airflow\.task\.operators\.fstream_provider|fstream_provider\.triggers\.transfer)")
_LEVEL = re.compile(r"\[(info|warning|error)\s*\]")


def example_dags_dir() -> Path:
    """The example DAGs installed with the provider (``fstream_provider.example_dags``), wheel or checkout alike."""
    from importlib.resources import files

    d = Path(str(files("fstream_provider.example_dags")))
    if not (d / "fstream_lcls_stream.py").is_file():
        raise FileNotFoundError(f"example DAG fstream_lcls_stream.py missing from {d}: the fstream package "
                                "was installed without its example DAGs")
    return d


def _instrument(run_dir: Path, *, files: int, size: int, every: float, stop: threading.Event) -> None:
    """Write ``files`` detector files of ``size`` bytes, one every ``every`` seconds (hidden name, then rename)."""
    rng = os.urandom(1 << 20)
    for i in range(files):
        if stop.wait(every if i else 0):
            return
        tmp, final = run_dir / f".r0042-s{i:03d}.xtc.writing", run_dir / f"r0042-s{i:03d}.xtc"
        with open(tmp, "wb") as f:
            left = size
            while left > 0:
                f.write(rng[: min(left, len(rng))])
                left -= len(rng)
        tmp.rename(final)


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run_demo(*, workdir: str | None = None, files: int = 48, file_size: int = 16 * 2**20, every: float = 0.12,
             target_throughput: str = "800Mbps", idle_exit: str = "3s", redis_url: str | None = None,
             out: Callable[[str], None] = print) -> dict[str, Any]:
    """Stream a generated LCLS-like run through Airflow and print the task log; return the XCom report.

    :param workdir: where data, Airflow home and logs go (a new temp dir by default; kept for inspection).
    :param files: detector files the "instrument" writes while the stream runs.
    :param file_size: bytes per file.
    :param every: seconds between files.
    :param target_throughput: the stream's QoS target.
    :param idle_exit: the stream ends after this long with no new file.
    :param redis_url: an existing Redis; default a private one in ``workdir``.
    :param out: where the story is printed.
    """
    from fstream_provider.bus.embedded import RedisServer
    from transfer_agent.receiving.receiver import Receiver
    from transfer_agent.daemon.worker import Agent

    work = Path(workdir or tempfile.mkdtemp(prefix="fstream-airflow-demo-"))
    run_dir, dst, home = work / "lcls" / "xpp" / "r0042", work / "received", work / "airflow-home"
    for d in (run_dir, dst, home):
        d.mkdir(parents=True, exist_ok=True)
    from fstream_provider.authz.ed25519 import ensure_pair
    from transfer_agent.wire.auth import create_secret_file, load_secret

    secret_file = create_secret_file(work / "secret")  # both sides read it through load_secret
    server = None
    if redis_url is None:
        server = RedisServer(str(work / "redis"))
        server.start()
        redis_url = server.url
    receiver = Receiver(listen=("127.0.0.1", 0), root=str(dst), secret=load_secret(secret_file)).start()
    from transfer_agent.daemon.authorize import AgentPolicy

    submitter_key = work / "airflow-demo.key"  # the DAGs' submitter identity: an Ed25519 pair (issues 32, 40)
    ensure_pair(submitter_key, "airflow-demo")
    policy = AgentPolicy.local([work / "lcls"], secret_file, submitter="airflow-demo",
                               public_key=f"{submitter_key}.pub")
    agent_key = work / "demo-agent.key"  # signs the job outcomes the DAG believes (issue 40): the connection trusts it
    ensure_pair(agent_key, "demo-agent")
    agent = Agent(redis_url, name="demo-agent", policy=policy, block_ms=200, poll_interval=0.2,
                  signing_key=str(agent_key))
    agent_thread = threading.Thread(target=agent.run, name="demo-agent", daemon=True)
    stop = threading.Event()
    writer = threading.Thread(target=_instrument, args=(run_dir,), daemon=True,
                              kwargs={"files": files, "size": file_size, "every": every, "stop": stop})
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__DAGS_FOLDER=str(example_dags_dir()),
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               FSTREAM_STATE_DIR=str(work / "state"),
               AIRFLOW_CONN_FSTREAM_DEFAULT=redis_url.replace("redis://", "fstream://", 1)
               + f"?submitter=airflow-demo&submitter_key_file={quote(str(submitter_key), safe='')}"
               + f"&trusted_agents={quote(str(agent_key) + '.pub', safe='')}")
    try:
        agent_thread.start()
        out(f"Airflow demo in {work}: Redis {redis_url}, receiver 127.0.0.1:{receiver.port}, agent demo-agent")
        out("preparing a private Airflow (sqlite) ...")
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=work, check=True,
                       capture_output=True, timeout=600)
        conf = {"run_dir": str(run_dir), "destination": f"fstream://127.0.0.1:{receiver.port}/lcls/xpp/r0042",
                "target_throughput": target_throughput, "idle_exit": idle_exit}
        out(f"instrument writes {files} x {file_size / 2**20:.0f} MiB files, one every {every} s; "
            f"dag fstream_lcls_stream streams them at a {target_throughput} target")
        out("$ airflow dags test fstream_lcls_stream --conf " + json.dumps(conf))
        writer.start()
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", _RUN_DAG, "fstream_lcls_stream", json.dumps(conf)], env=env,
                                cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        result = None
        with open(work / "dag-test.log", "w") as full_log:
            for line in proc.stdout:  # the task log as it is written (interval lines come at the end of deferral)
                full_log.write(line)
                if line.startswith("RESULT_JSON "):
                    result = json.loads(line[len("RESULT_JSON "):])
                    continue
                m = _TASK_LINE.search(line)
                if m:
                    level = _LEVEL.search(line).group(1)
                    out(("  WARNING " if level != "info" else "  ") + m.group(1))
        proc.wait()
        if result is None or result["state"] != "success":
            raise RuntimeError(f"the demo DAG run failed (exit {proc.returncode}); full log: {work / 'dag-test.log'}")
        report = result["xcom"]["stream_run:return_value"]
        landed = dst / "lcls" / "xpp" / "r0042"
        same = all(_sha(p) == _sha(landed / p.name) for p in run_dir.glob("*.xtc"))
        out(f"DAG run succeeded in {time.monotonic() - t0:.1f} s: {report['files']} files, "
            f"{report['verified_files']} verified, byte-identical at the destination: {'yes' if same else 'NO'}")
        report["plot"] = _draw_plot(redis_url, report["job_id"], work / "plot.png")  # no UI here: draw it now
        out(f"plot: {report['plot']}")
        out(f"full Airflow output: {work / 'dag-test.log'}")
        return report
    finally:
        stop.set()
        agent.stop()
        agent_thread.join(timeout=30)
        receiver.stop()
        if server is not None:
            server.stop()


def main() -> int:
    run_demo()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _draw_plot(redis_url: str, job_id: str, path: Path) -> str | None:
    """The job's plot from its events (what the provider's Airflow plugin draws when the UI asks for it)."""
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.jobs import JobStore
    from fstream_provider.model.plot import plot_png
    from fstream_provider.model.tasklog import intervals_from_events

    client = connect(redis_url)
    try:
        store = JobStore(client)
        job = store.get(job_id)
        data = plot_png(intervals_from_events(store.all_events(job_id)),
                        job.spec.target_throughput_bps if job else None, title=f"FStream job {job_id}")
    finally:
        client.close()
    if not data:
        return None
    path.write_bytes(data)
    return str(path)
