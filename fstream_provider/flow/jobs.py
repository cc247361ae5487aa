"""``channel.transfer(..., redis=URL)``: each item becomes a job on the Redis bus; its events become records.

Any ``fstream agent`` on that Redis runs the jobs (on the transfer node that holds the files);
this process only submits and follows, the way the Airflow operator does. A job's records come out
when it ended, one per file: an agent that retries a job, or takes over a dead agent's, reports a
file again (failed by the first try, skipped by the next), and only the last word counts. A batch whose files
go to different destination directories is split into one job per directory, because a job places
the files it names directly under its destination path.
"""

from __future__ import annotations

import posixpath
import threading
from pathlib import Path
from typing import Any, Callable

from fstream_provider.flow.pipe import END, Cancelled, Pipe, Subscription, items
from fstream_provider.flow.records import FlowError
from fstream_provider.model.spec import TransferSpec

MAX_JOBS = 16  # jobs followed at once


def follow_batches(spec: TransferSpec, redis_url: str, namespace: str | None, sub: Subscription, inp: Pipe,
                   out: Any, rel: Callable[[Path], str], files: Callable[[Any], list[Path]]) -> None:
    """Start the submitting and following threads of one subscription (see the module docstring)."""
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import resolve_redis_url
    from fstream_provider.bus.jobs import JobStore

    from fstream_provider.bus.keys import Keys

    from fstream_provider.authz.signing import resolve_signer

    from fstream_provider.authz.outcome import TrustedAgents

    # issue 40: a job counts as done only with an outcome a trusted agent signed ($FSTREAM_TRUSTED_AGENTS, else the
    # local agent's key), and a file as landed only if that signed result lists it
    store = JobStore(connect(resolve_redis_url(redis_url)), keys=Keys(namespace) if namespace else None,
                     signer=resolve_signer(), trust=TrustedAgents.resolve())
    dest = spec.dest
    running: dict[str, threading.Thread] = {}
    lock = threading.Lock()
    room = threading.Semaphore(MAX_JOBS)

    def cancel_all() -> None:
        with lock:
            ids = list(running)
        for job_id in ids:
            store.cancel(job_id, "the flow that submitted it was cancelled")

    sub.on_close(cancel_all)

    def follow(job_id: str, n_files: int) -> None:
        from fstream_provider.bus.follow import follow_job

        last: dict[str, dict] = {}  # a retried or redelivered job reports a file again: its last word counts

        def on_event(_eid: str, ev: dict) -> None:
            if ev.get("kind") == "file" and ev.get("status") in ("committed", "skipped", "failed"):
                last[ev.get("source") or ev.get("path")] = ev

        try:
            state = follow_job(store, job_id, on_event=on_event, on_idle=lambda _s: _stop_if(sub))
            if state.state != "succeeded":
                if not sub.stop.is_set():
                    out.fail(FlowError(f"job {job_id} ({', '.join(spec_sources(state))}) {state.state}: "
                                       f"{state.error or 'no reason given'}"))
                return
            signed = {(r.get("source"), r.get("path")): r for r in (state.result or {}).get("landed") or []
                      if isinstance(r, dict)}
            delivered = 0
            for ev in last.values():  # one record per file, once the job ended
                rec = signed.get((ev.get("source"), ev.get("path")))
                if ev.get("status") == "failed" or rec is not None:
                    out.deliver({**ev, **(rec or {})})  # size, status and checksum as the agent signed them
                    delivered += 1
            if n_files > delivered:
                out.slots.give(n_files - delivered)
        except Cancelled:
            pass
        except BaseException as exc:  # noqa: BLE001 - the subscriber sees it
            out.fail(exc)
        finally:
            with lock:
                running.pop(job_id, None)
            room.release()

    def submit() -> None:
        try:
            for x in items(inp):
                groups: dict[str, list[Path]] = {}
                for p in files(x):
                    groups.setdefault(posixpath.dirname(rel(p)), []).append(p)
                for folder, paths in ((f, g[i:i + out.slots.n]) for f, g in groups.items()
                                      for i in range(0, len(g), out.slots.n)):  # a job never holds more than the slots
                    out.slots.take(len(paths))
                    while not room.acquire(timeout=0.1):
                        _stop_if(sub)
                    job_spec = TransferSpec.from_dict({**spec.to_dict(), "sources": [str(p.absolute()) for p in paths],
                                                       "destination": f"fstream://{dest.host}:{dest.port}/{folder}"})
                    job_id, _created = store.submit(job_spec)
                    t = threading.Thread(target=follow, args=(job_id, len(paths)), name=f"fstream-flow-job-{job_id}",
                                         daemon=True)
                    with lock:
                        running[job_id] = t
                    t.start()
            for _ in range(MAX_JOBS):  # every job followed to its end
                while not room.acquire(timeout=0.1):
                    _stop_if(sub)
        except Cancelled:
            return
        except BaseException as exc:  # noqa: BLE001 - the subscriber sees it
            out.fail(exc)
            return
        finally:
            inp.close()
        out.put(END)

    sub.spawn("transfer-submit", submit, out)


def spec_sources(state: Any) -> list[str]:
    srcs = list(getattr(state.spec, "sources", []) or [])
    return srcs[:3] + ([f"and {len(srcs) - 3} more"] if len(srcs) > 3 else [])


def _stop_if(sub: Subscription) -> None:
    if sub.stop.is_set():
        raise Cancelled()
