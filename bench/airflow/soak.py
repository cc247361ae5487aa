"""Issue 41's Airflow soak: a steady stream of DAG runs under every fault a facility's Airflow meets.

``fstream bench airflow-soak [--minutes 30] [--every 10s] [--files 16] [--fault-every 100s] [--seed S]``

- a real Airflow 3 (api-server, scheduler, dag-processor, triggerer as four processes: ``airflow_procs``) runs a
  DAG whose ``FStreamTransferOperator(deferrable=True, retries=R)`` sends one new source directory per run
  (``--retries``, default 2 as docs/airflow/operators.md advises for deferred transfers: Airflow 3.3 fails a
  deferred task whose trigger fires before the scheduler saw its worker exit, apache/airflow#71580 and #72716;
  ``--retries 0`` shows how often);
- the bus is a Redis Sentinel group (``sentinel_group``: master, replica, one sentinel), reached by everyone
  through its Sentinel URL with ``wait_replicas=1``; a real ``fstream agent`` process and a real ``fstream
  receive`` process move the files;
- a producer makes a directory of ``--files`` files (64 KiB to 1 MiB, seeded) and triggers a run every ``--every``;
- a fault every ``--fault-every`` (jittered ±30 %), kinds in a seeded shuffled round-robin (every kind is hit):
  ``redis_outage`` (both Redis servers stopped for ``--outage``, 30 s), ``sentinel_failover`` (the master
  SIGKILLed, the replica promoted), ``triggerer_kill`` (SIGKILL, then a new triggerer), ``scheduler_restart``,
  ``api_server_restart``, ``agent_drain`` (SIGTERM: the agent drains, exits, and starts again) and
  ``key_rotation`` (``fstream keys rotate`` on the secret the agent and the receiver share);
- at the end the producer stops and every run is waited for; then for every run: its task's state against its
  job's outcome (``succeeded`` -> success, else failed), and its files at the destination (each source file
  byte-identical, no ``.part``, one ``committed`` record per file).

The goals (issue 41): **0** tasks whose state differs from their job's outcome, **0** files lost or duplicated.
Report: ``bench/results/airflow-soak-<stamp>.{json,md}``; exit status 1 if a goal is missed.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fstream_bench.core import provenance
from fstream_provider.model.units import parse_duration

RESULTS = Path(__file__).resolve().parents[1] / "results"
MODULES = (*provenance.AGENT, "fstream_provider.operators", "fstream_provider.triggers", "fstream_provider.hooks",
           "fstream_bench.airflow.soak", "fstream_bench.airflow.procs", "fstream_bench.ops.sentinel_group")
FAULTS = ("redis_outage", "sentinel_failover", "triggerer_kill", "scheduler_restart", "api_server_restart",
          "agent_drain", "key_rotation")
DAG_ID, TASK, SUBMITTER = "fstream_soak", "transfer", "soak"
OUTCOME = {"succeeded": "success", "failed": "failed", "cancelled": "failed"}  # a job's state -> its task's
DAG = '''
"""The DAG of fstream bench airflow-soak: one deferred transfer per run, its source and destination from the conf."""
from datetime import datetime, timedelta

from airflow.sdk import DAG

from fstream_provider.operators.transfer import FStreamTransferOperator

with DAG("fstream_soak", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=32):
    FStreamTransferOperator(task_id="transfer", sources="{{ dag_run.conf['source'] }}",
                            destination="{{ dag_run.conf['destination'] }}", tuner="fixed", cc=2, p=1,
                            deferrable=True, retries=RETRIES, retry_delay=timedelta(seconds=5))
'''


def _fstream(*args: str) -> list[str]:
    return [sys.executable, "-m", "transfer_agent.cli", *args]


class Daemon:
    """One ``fstream`` daemon process (agent or receiver), restartable, logging to ``log``."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.argv, self.log, self.env = argv, log, env
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        self.starts += 1

    def drain(self, timeout: float = 120.0) -> int | None:
        """SIGTERM (the daemon drains and exits); the exit status, or None if it had to be killed."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.drain(60)


class Soak:
    """The rig and the run: Sentinel group, receiver, agent, Airflow; the producer and the fault injector."""

    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        from fstream_bench.airflow.procs import Airflow
        from fstream_bench.ops.sentinel_group import SentinelGroup
        from fstream_provider.authz.ed25519 import ensure_pair

        self.work, self.args = work, args
        self.rnd = random.Random(args.seed)
        self.group = SentinelGroup(work / "redis")
        self.secret = work / "secret"
        self.secret.write_text(secrets.token_hex(32) + "\n")
        self.secret.chmod(0o600)
        key = work / "submitter.key"
        ensure_pair(key, SUBMITTER)  # Ed25519: the Airflow connection names key, the agent's policy key.pub
        self.dst = work / "dst"
        self.dst.mkdir()
        self.env = dict(os.environ, FSTREAM_STATE_DIR=str(work / "state"))
        self.key = key
        self.rx_port = 0
        self.receiver: Daemon | None = None
        self.agent: Daemon | None = None
        dags = work / "dags"
        dags.mkdir()
        (dags / "fstream_soak.py").write_text(DAG.replace("RETRIES", str(int(args.retries))))
        self.af_cls, self.dags = Airflow, dags
        self.af: Any = None
        self.runs: list[dict] = []
        self.faults: list[dict] = []
        self.errors: list[str] = []
        self.stop_producing = threading.Event()
        self.t0 = time.monotonic()

    # -- set-up -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        from fstream_provider.bus.embedded import free_port

        self.group.start()
        bus = self.group.url + "&wait_replicas=1"
        self.rx_port = free_port()
        (self.work / "policy.toml").write_text(
            f'[agent]\nroots = ["{self.work / "src"}"]\ndestinations = ["fstream://127.0.0.1:{self.rx_port}/"]\n'
            f'[agent.keys]\ndefault = "{self.secret}"\n[submitters.{SUBMITTER}]\npublic_key_file = "{self.key}.pub"\n')
        self.receiver = Daemon(_fstream("receive", "--listen", f"127.0.0.1:{self.rx_port}", "--root", str(self.dst),
                                        "--secret-file", str(self.secret)), self.work / "receiver.log", self.env)
        self.receiver.start()
        self.agent = Daemon(_fstream("agent", "--redis", bus, "--policy", str(self.work / "policy.toml"),
                                     "--name", "soak-agent", "--drain-grace", "60s"), self.work / "agent.log",
                            self.env)
        self.agent.start()
        conn = "fstream://?" + urlencode({"url": bus, "submitter": SUBMITTER, "submitter_key_file": str(self.key)})
        self.af = self.af_cls(self.work / "airflow", self.dags, {"FSTREAM_STATE_DIR": str(self.work / "state"),
                                                                 "AIRFLOW_CONN_FSTREAM_DEFAULT": conn})
        self.af.migrate()
        self.af.start_all()
        self.af.wait_dag(DAG_ID)
        self.bus = bus

    def stop(self) -> None:
        for step in (lambda: self.af and self.af.stop_all(), lambda: self.agent and self.agent.stop(),
                     lambda: self.receiver and self.receiver.stop(), self.group.stop):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - tear down the rest whatever one part did
                self.errors.append(f"stopping: {type(exc).__name__}: {exc}")

    # -- the producer ---------------------------------------------------------------------------------------------
    def produce(self) -> None:
        every = parse_duration(self.args.every)
        n = 0
        while not self.stop_producing.is_set():
            n += 1
            src = self.work / "src" / f"run{n:04d}"
            src.mkdir(parents=True)
            digests = {}
            for i in range(self.args.files):
                data = self.rnd.randbytes(self.rnd.randint(64 * 1024, 1024 * 1024))
                (src / f"f{i:03d}.bin").write_bytes(data)
                digests[f"f{i:03d}.bin"] = hashlib.sha256(data).hexdigest()
            run_id = f"soak{n:04d}"
            try:
                self._with_api(lambda: self.af.trigger(DAG_ID, {
                    "source": str(src), "destination": f"fstream://127.0.0.1:{self.rx_port}/{run_id}"},
                    run_id=run_id))
                self.runs.append({"run_id": run_id, "src": str(src), "digests": digests, "t_s": self._now()})
            except Exception as exc:  # noqa: BLE001 - a run that could not be triggered is reported, not fatal
                self.errors.append(f"triggering {run_id}: {type(exc).__name__}: {exc}")
            self.stop_producing.wait(every)

    def _with_api(self, fn: Any, timeout: float = 120.0) -> Any:
        """The api-server may be restarting (a fault): try again until it answers."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return fn()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)  # the api-server restarts in seconds

    # -- faults ----------------------------------------------------------------------------------------------
    def inject(self, kind: str) -> dict:
        rec: dict[str, Any] = {"kind": kind, "t_s": self._now()}
        t = time.monotonic()
        if kind == "redis_outage":
            self.group.outage(parse_duration(self.args.outage))
        elif kind == "sentinel_failover":
            rec["promoted_s"] = round(self.group.failover(), 2)
        elif kind == "triggerer_kill":
            self.af.kill("triggerer")
            self.af.start("triggerer")
        elif kind == "scheduler_restart":
            self.af.restart("scheduler")
        elif kind == "api_server_restart":
            self.af.restart("api-server", stop_timeout=10)
        elif kind == "agent_drain":
            assert self.agent is not None
            rec["agent_exit"] = self.agent.drain()
            self.agent.start()
        elif kind == "key_rotation":
            out = subprocess.run(_fstream("keys", "rotate", str(self.secret), "--window", "1h"), env=self.env,
                                 capture_output=True, text=True, timeout=120)
            rec["rotate_exit"] = out.returncode
            if out.returncode != 0:
                self.errors.append(f"key rotation: {out.stdout}{out.stderr}")
        rec["seconds"] = round(time.monotonic() - t, 2)
        return rec

    def fault_loop(self, until: float) -> None:
        every = parse_duration(self.args.fault_every)
        order: list[str] = []
        while True:
            wait = every * self.rnd.uniform(0.7, 1.3)
            if time.monotonic() + wait > until:
                return
            time.sleep(wait)  # the soak's clock: a fault every ~fault_every seconds
            if not order:
                order = list(FAULTS)
                self.rnd.shuffle(order)
            kind = order.pop(0)
            try:
                self.faults.append(self.inject(kind))
            except Exception as exc:  # noqa: BLE001 - a fault that failed to inject is reported; the soak goes on
                self.errors.append(f"fault {kind}: {type(exc).__name__}: {exc}")
            print(f"[{self._now():7.1f} s] fault {kind} done ({len(self.runs)} runs so far)", file=sys.stderr,
                  flush=True)

    def _now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    # -- the end ------------------------------------------------------------------------------------------------
    def settle(self, timeout: float) -> None:
        """Wait until every run has finished (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = dict(self._with_api(lambda: self.af.runs(DAG_ID)))
            if all(states.get(r["run_id"]) in ("success", "failed") for r in self.runs):
                return
            time.sleep(2.0)  # polling Airflow's database with a deadline

    def _retry_causes(self, run_id: str) -> list[str]:
        """Why Airflow ended a try of this run's task early, from the scheduler's log: Airflow 3.3's race (a
        deferred task's worker exit seen after its trigger fired: "finished with state success, but the task
        instance's state attribute is queued"), an executor failure before the task ran, or a failed try."""
        out = []
        for line in self.af.log("scheduler").splitlines():
            if f"run_id='{run_id}'" not in line and f" {run_id} [" not in line and f"run_id={run_id}," not in line:
                continue
            if "finished with state success, but the task instance's state attribute is" in line:
                out.append("airflow_defer_race")
            elif "finished with state failed, but the task instance's state attribute is" in line:
                out.append("executor_failed_before_run")
        return out

    def check(self) -> dict:
        from fstream_provider.bus.client import connect
        from fstream_provider.bus.jobs import JobStore

        client = connect(self.bus)
        store = JobStore(client)
        rows, mismatched, lost, duplicated, unfinished = [], 0, 0, 0, 0
        try:
            index = {j.idempotency_key: j for j in store.list(100_000)}
            for r in self.runs:
                key = f"{DAG_ID}/{r['run_id']}/{TASK}/-1"
                jobs = sorted((j for k, j in index.items() if k == key or (k or "").startswith(key + "#")),
                              key=lambda j: j.created_at)
                ti_state, tries = self.af.task(DAG_ID, r["run_id"], TASK)
                last = jobs[-1] if jobs else None
                expected = OUTCOME.get(last.state) if last is not None else None
                committed = [e.get("path") for j in jobs for _, e in store.all_events(j.job_id)
                             if e.get("kind") == "file" and e.get("status") == "committed"]
                counts = collections.Counter(Path(p).name for p in committed)
                landed = self.dst / r["run_id"]
                missing = [n for n, d in r["digests"].items()
                           if not (landed / n).is_file() or hashlib.sha256((landed / n).read_bytes()).hexdigest() != d]
                dup = sum(c - 1 for c in counts.values() if c > 1)
                parts = [str(p) for p in landed.rglob("*.part*")] if landed.exists() else []
                finished = ti_state in ("success", "failed")
                ok_state = finished and ti_state == expected
                never_ran = False
                if not jobs and ti_state == "failed":
                    # no job: either Airflow failed the task before the operator ran (its task runner could not
                    # reach a restarting api-server: not FStream's to decide, counted apart), or our operator ran
                    # and failed before submitting (a mismatch: the bus was there to be waited for)
                    never_ran = "FStreamTransferOperator" not in self.af.task_logs(DAG_ID, r["run_id"], TASK)
                    ok_state = never_ran
                row = {"run_id": r["run_id"], "task": ti_state, "tries": tries, "jobs": len(jobs),
                       "retried_for": self._retry_causes(r["run_id"]) if tries > 1 or ti_state == "failed" else [],
                       "job": last.state if last else None, "job_error": (last.error if last else None),
                       "files": len(r["digests"]), "missing": len(missing), "duplicated": dup, "parts": len(parts),
                       "state_matches": ok_state, "failed_before_operator_ran": never_ran}
                rows.append(row)
                unfinished += not finished
                mismatched += finished and not ok_state
                if last is not None and last.state == "succeeded":
                    lost += len(missing)  # a job that says it landed everything must have
                duplicated += dup
        finally:
            client.close()
        return {"runs": rows, "tasks": len(rows), "state_mismatches": mismatched, "unfinished": unfinished,
                "files_lost": lost, "files_duplicated": duplicated,
                "jobs_not_succeeded": sum(1 for r in rows if r["jobs"] and r["job"] != "succeeded"),
                "failed_before_operator_ran": sum(1 for r in rows if r["failed_before_operator_ran"]),
                "retried": sum(1 for r in rows if r["tries"] > 1),
                "retry_causes": dict(collections.Counter(c for r in rows for c in r["retried_for"])),
                "tasks_failed": sum(1 for r in rows if r["task"] == "failed")}


def soak_goal(doc: dict, _: Path) -> tuple[str, str]:
    """The goals table's reader (issue 41): tasks whose state differs from their job's outcome, files lost or
    duplicated, over how many runs and faults; met when both are 0."""
    r, g = doc["result"], doc["goals"]
    faults = ", ".join(f"{k} ×{n}" for k, n in sorted(doc["fault_counts"].items()))
    text = (f"{g['state_mismatches']} of {r['tasks']} tasks off their job's outcome, {g['files_lost_or_duplicated']} "
            f"files lost or duplicated ({doc['args']['minutes']:g} min; faults: {faults}; "
            f"{r['jobs_not_succeeded']} jobs did not succeed, {r['failed_before_operator_ran']} tasks failed by "
            "Airflow before the operator ran)")
    return text, "yes" if doc.get("met") else "no"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fstream bench airflow-soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every", default="10s", help="a new DAG run this often (default 10s)")
    ap.add_argument("--files", type=int, default=16, help="files per run (default 16)")
    ap.add_argument("--fault-every", default="100s", help="a fault this often, jittered ±30%% (default 100s)")
    ap.add_argument("--outage", default="30s", help="how long a redis_outage lasts (default 30s)")
    ap.add_argument("--settle", default="10m", help="how long the end waits for the last runs (default 10m)")
    ap.add_argument("--retries", type=int, default=2,
                    help="the transfer task's retries (default 2, as the docs advise)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--results", default=str(RESULTS))
    return ap


def main(argv: list[str] | None = None) -> int:
    import tempfile

    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    prov = provenance.start("airflow-soak", argv, MODULES)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fstream-airflow-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    soak = Soak(work, args)
    try:
        soak.start()
        soak.t0 = time.monotonic()
        until = soak.t0 + args.minutes * 60
        producer = threading.Thread(target=soak.produce, name="producer", daemon=True)
        producer.start()
        soak.fault_loop(until)
        time.sleep(max(0.0, until - time.monotonic()))
        soak.stop_producing.set()
        producer.join(120)
        soak.settle(parse_duration(args.settle))
        result = soak.check()
    finally:
        soak.stop()
    kinds = collections.Counter(f["kind"] for f in soak.faults)
    sentinel_log = work / "redis" / "sentinel.log"
    switches = sentinel_log.read_text(errors="replace").count("+switch-master") if sentinel_log.exists() else None
    doc = {"bench": "airflow-soak", "args": vars(args), "workdir": str(work), "faults": soak.faults,
           "fault_counts": dict(kinds), "errors": soak.errors, "result": result,
           "sentinel_switches": switches,  # every master change the sentinel made, asked for or not (a loaded host)
           "goals": {"state_mismatches": result["state_mismatches"] + result["unfinished"],
                     "files_lost_or_duplicated": result["files_lost"] + result["files_duplicated"]},
           "provenance": provenance.finish(prov)}
    met = doc["goals"]["state_mismatches"] == 0 and doc["goals"]["files_lost_or_duplicated"] == 0
    doc["met"] = met
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"airflow-soak-{stamp}.json").write_text(json.dumps(doc, indent=1, default=str))
    md = _markdown(doc)
    (out / f"airflow-soak-{stamp}.md").write_text(md)
    print(md)
    return 0 if met else 1


def _markdown(doc: dict) -> str:
    r, a = doc["result"], doc["args"]
    lines = [f"# Airflow soak ({a['minutes']:g} min, a run every {a['every']}, {a['files']} files each, "
             f"retries {a.get('retries', 0)}, "
             f"a fault every ~{a['fault_every']}, seed {a['seed']})", "",
             "| measure | goal | measured |", "|---|---|---|",
             f"| tasks whose state differs from their job's outcome (or never finished) | 0 | "
             f"{doc['goals']['state_mismatches']} of {r['tasks']} |",
             f"| files lost or duplicated | 0 | {doc['goals']['files_lost_or_duplicated']} "
             f"({r['files_lost']} lost, {r['files_duplicated']} duplicated) |",
             f"| jobs that did not succeed (their tasks failed with them) | - | {r['jobs_not_succeeded']} |",
             f"| tasks Airflow failed before the operator ran (no job; e.g. its task runner met a restarting "
             f"api-server) | - | {r['failed_before_operator_ran']} |",
             f"| tasks that took more than one try (retries {a['retries']}); Airflow's reasons, from its scheduler "
             f"log | - | {r['retried']}: {r['retry_causes'] or '-'} |", "",
             "Faults: " + ", ".join(f"{k} x{n}" for k, n in sorted(doc["fault_counts"].items()))
             + f"; the sentinel changed masters {doc['sentinel_switches']} times in all", ""]
    if doc["errors"]:
        lines += ["Errors:", *[f"- {e}" for e in doc["errors"][:20]], ""]
    bad = [x for x in r["runs"] if not x["state_matches"] or x["missing"] or x["duplicated"] or x["parts"]]
    if bad:
        lines += ["Runs off the goal:", *[f"- {json.dumps(x)}" for x in bad[:30]], ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
