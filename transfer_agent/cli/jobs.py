"""The job subcommands of ``fstream``: ``agent``, ``submit``, ``status``, ``cancel`` (wired by ``transfer_agent.cli``;
``reconcile`` and ``redis`` are in ``cli.bus_admin``)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from fstream_provider.bus.keys import Keys
from fstream_provider.model.units import parse_duration
from transfer_agent.errors import FStreamError

if TYPE_CHECKING:  # redis (imported by the job model) costs half a second: only commands that use it load it
    from fstream_provider.bus.job_state import JobState
    from fstream_provider.bus.jobs import JobStore

from transfer_agent.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from transfer_agent.cli.redis_auth import add_redis_options


def _common(p: argparse.ArgumentParser) -> None:
    add_redis_options(p, "Redis URL (default: $FSTREAM_REDIS_URL, else a private embedded redis-server)")
    p.add_argument("--namespace", default="fstream", help=argparse.SUPPRESS)


def _store(args: argparse.Namespace, signer: Any = None) -> JobStore:
    from fstream_provider.bus.jobs import JobStore
    from fstream_provider.bus.client import connect
    from fstream_provider.bus.embedded import resolve_redis_url

    retention = getattr(args, "job_retention", None)  # only the commands that write a terminal state or submit
    return JobStore(connect(resolve_redis_url(args.redis)), keys=Keys(args.namespace), signer=signer,
                    **({"retention_s": retention} if retention is not None else {}))


def _add_trust_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trusted-agents", metavar="PATH",
                   help="the agents whose signed outcomes count: a file of 'fstream-ed25519 ...' lines or a directory "
                        "of .pub files (default $FSTREAM_TRUSTED_AGENTS, else the local agent's "
                        "<state dir>/agent.key.pub); a success no trusted agent signed is not done")


def _trust(args: argparse.Namespace) -> Any:
    """The agents this command believes (``authz.outcome.TrustedAgents``); a bad file is a usage error."""
    from fstream_provider.authz.ed25519 import KeyFormatError
    from fstream_provider.authz.outcome import TrustedAgents

    try:
        return TrustedAgents.resolve(getattr(args, "trusted_agents", None))
    except KeyFormatError as exc:
        raise FStreamError(f"--trusted-agents: {exc}") from None


def _live_agents(store: JobStore) -> list[dict]:
    out = []
    for name in sorted(store.client.smembers(store.keys.agents())):
        h = store.client.hgetall(store.keys.agent(name))
        if h:
            out.append(h)
    return out


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


# -- agent -----------------------------------------------------------------------------------------
def add_agent_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("agent", help="consume transfer jobs from Redis (source-side worker)")
    _common(p)
    p.add_argument("--name", help="consumer name (default HOST-PID)")
    p.add_argument("--secret-file", metavar="F", help="the keyring's 'default' key (a shared-secret file)")
    p.add_argument("--policy", metavar="FILE", help="the authorization policy (source roots, destinations, keyring, "
                                                    "submitters; docs/authorization.md; default $FSTREAM_POLICY)")
    p.add_argument("--root", action="append", metavar="DIR", default=[],
                   help="serve sources under DIR (repeatable; without --policy: for the local submitter only, "
                        "whose key `fstream submit` uses by default)")
    p.add_argument("--allow-hardlinks", action="store_true",
                   help="with --root: send files that have several hard links (refused by default: another name "
                        "may lie outside the roots; with --policy: [agent] allow_hardlinks)")
    p.add_argument("--signing-key", metavar="FILE",
                   help="the agent's Ed25519 key that signs job outcomes (default: the policy's [agent] signing_key, "
                        "else <state dir>/agent.key, made on first start; clients trust its .pub)")
    p.add_argument("--once", action="store_true", help="one iteration (at most one job), errors re-raised")
    p.add_argument("--drain-grace", metavar="DURATION", default="30s",
                   help="on SIGTERM, take no new job and let the running one finish its open files for this long; "
                        "what it has not started is handed back for another agent; SIGINT stops at once "
                        "(default 30s)")
    p.add_argument("--heartbeat-ttl", metavar="DURATION", default="10s", help="heartbeat key TTL (default 10s)")
    p.add_argument("--claim-idle", metavar="DURATION", default="30s",
                   help="reclaim a dead agent's job after it was idle this long (default 30s)")
    p.add_argument("--max-deliveries", type=int, default=5, help="dead-letter a job taken this often (default 5)")
    p.add_argument("--max-retries", type=int, default=3, help="retries of retryable failures per claim (default 3)")
    p.add_argument("--scheduler", choices=("fifo", "seal", "steal", "seal-share", "steal-share"), default="fifo",
                   help="fifo: jobs in arrival order (default); seal/steal: all agents of the namespace share one "
                        "SEAL/STEAL scheduler that picks, preempts and sizes jobs (use the same on every agent; "
                        "`fstream schedule` shows it); seal-share/steal-share: the same, but a job that would wait "
                        "on a saturated endpoint starts beside the running ones while the endpoint stays below its "
                        "knee, and a small job gets an equal share (docs/scheduling.md)")
    p.add_argument("--preemption-factor", type=float, default=1.5, metavar="PF",
                   help="seal/steal: a waiting job preempts running ones whose xfactor is PF times lower (default 1.5)")
    p.add_argument("--lambda", dest="lambda_", type=float, default=1.0, metavar="L",
                   help="steal: batch jobs fill at most this share of an endpoint's maximum (default 1)")
    p.add_argument("--promote-after", metavar="DURATION",
                   help="steal: a batch job waiting this long is treated as interactive (default never)")
    p.add_argument("--batch-goal-share", type=float, default=None, metavar="S",
                   help="steal: an interactive job frees batch jobs until it would get this share of its "
                        "batch-free throughput (default 0.6; 1 as the paper prints it)")
    from transfer_agent.cli.options import add_history_options, add_retention_option
    add_history_options(p)
    add_retention_option(p, "set on each job this agent finishes (give every agent of a bus the same)")
    from transfer_agent.service.options import add_service_options
    add_service_options(p, receiver=False)
    p.set_defaults(func=cmd_agent)
    return p


def cmd_agent(args: argparse.Namespace) -> int:
    import logging
    import signal

    from fstream_provider.bus.client import describe
    from fstream_provider.bus.embedded import resolve_redis_url
    from transfer_agent.daemon.worker import Agent

    from transfer_agent.cli.options import history_from_args
    from transfer_agent.daemon.worker import default_agent_name
    from transfer_agent.service.sdnotify import Watchdog
    from transfer_agent.storage.tree_hash import native_line

    from fstream_provider.tuning.scheduler import SealConfig

    url = resolve_redis_url(args.redis)
    name = args.name or default_agent_name()
    try:
        extra = {} if args.batch_goal_share is None else {"batch_goal_share": args.batch_goal_share}
        sched = SealConfig(pf=args.preemption_factor, lambda_=args.lambda_, small_s=1.0,
                           promote_after_s=parse_duration(args.promote_after) if args.promote_after else None, **extra)
    except ValueError as exc:
        print(f"fstream agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        policy = _agent_policy(args)
    except (ValueError, FStreamError) as exc:
        print(f"fstream agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from transfer_agent.service.attach import AgentService

    service = AgentService(args)  # issue 30: --metrics-listen, --check (a bad address: exit 2)
    if args.check:
        return service.check(url, Keys(args.namespace), policy)
    agent = Agent(url, name=name, policy=policy, secret_file=args.secret_file, scheduler=args.scheduler,
                  sched_config=sched,
                  heartbeat_ttl=parse_duration(args.heartbeat_ttl),
                  claim_idle_ms=int(parse_duration(args.claim_idle) * 1000), max_deliveries=args.max_deliveries,
                  max_retries=args.max_retries, keys=Keys(args.namespace),
                  drain_grace=parse_duration(args.drain_grace), job_retention_s=args.job_retention,
                  history=history_from_args(args, keys=Keys(args.namespace), source=name),
                  watchdog=Watchdog.from_env(),  # a unit's WatchdogSec= (issue 39)
                  signing_key=_signing_key(args))
    try:  # a key that cannot be read stops the agent here, naming it (issue 40), not in its loop
        from fstream_provider.authz.outcome import load_signer

        agent.outcome_signer = load_signer(agent.signing_key, agent.name)
    except ValueError as exc:  # model.keyfile.KeyFileError: the file and the reason
        print(f"fstream agent: signing key: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("transfer_agent.daemon").setLevel(args.log_level.upper() if args.log_level else logging.INFO)
    previous = signal.signal(signal.SIGINT, lambda *_: agent.stop())
    how = "" if args.scheduler == "fifo" else f" (scheduler {args.scheduler})"
    print(f"fstream agent {agent.name}: consuming jobs on {describe(url)}{how}", file=sys.stderr, flush=True)
    print(f"fstream agent {agent.name}: {native_line()}", file=sys.stderr, flush=True)  # issue 39: once, at start
    from transfer_agent.cli.sighup import Hangup

    def _reloader():
        from transfer_agent.cli.reload import AGENT_LIVE, Reloader, agent_apply
        return Reloader(args, AGENT_LIVE, agent_apply(agent, service, url, Keys(args.namespace)))

    reloader = None
    try:
        service.start(agent, url, Keys(args.namespace))  # issue 30: /metrics, /healthz, /readyz (with the option)
        reloader = Hangup(_reloader).install()  # SIGHUP (cli.reload is imported on the first one)
        agent.run(once=args.once)
    finally:
        signal.signal(signal.SIGINT, previous)
        if reloader is not None:
            reloader.close()
        service.stop()
    return EXIT_OK


def _signing_key(args: argparse.Namespace) -> str | None:
    """``--signing-key``, else the policy file's ``[agent] signing_key``, else None (``<state dir>/agent.key``)."""
    import os

    if args.signing_key:
        return args.signing_key
    path = args.policy or os.environ.get("FSTREAM_POLICY")
    if not path:
        return None
    from fstream_provider.authz.policy import load_policy

    return load_policy(path).agent.signing_key or None


def _agent_policy(args: argparse.Namespace) -> Any:
    """The agent's authority: ``--policy FILE`` (or ``$FSTREAM_POLICY``), or ``--root DIR`` for the local
    submitter; neither is refused: an agent serves only the roots it is configured with."""
    import os

    from transfer_agent.daemon.authorize import AgentPolicy

    path = args.policy or os.environ.get("FSTREAM_POLICY")
    if path and (args.root or args.allow_hardlinks):
        raise ValueError("--root/--allow-hardlinks and --policy: give them in the policy file ([agent] roots, "
                         "allow_hardlinks)")
    if path:
        return AgentPolicy.from_file(path)
    if not args.root:
        raise ValueError("no source roots: an agent serves only the roots it is configured with; give --root DIR "
                         "(for your own jobs) or --policy FILE (docs/authorization.md)")
    from fstream_provider.model.statedir import default_secret_file

    secret = args.secret_file or (str(default_secret_file()) if default_secret_file().exists() else None)
    return AgentPolicy.local(args.root, secret, allow_hardlinks=args.allow_hardlinks)


# -- submit ----------------------------------------------------------------------------------------
def add_submit_parser(subparsers: Any) -> argparse.ArgumentParser:
    from transfer_agent.cli.options import add_transfer_options

    p = subparsers.add_parser("submit", help="queue a transfer job for an agent, then follow it")
    add_transfer_options(p)
    _common(p)
    p.add_argument("--detach", action="store_true", help="print the job id and return at once")
    p.add_argument("--submitter", metavar="ID", help="sign the job as this submitter (default $FSTREAM_SUBMITTER, "
                                                     "else 'local' with the key in the state dir)")
    p.add_argument("--submitter-key", metavar="FILE", help="the submitter's Ed25519 private key file "
                         "(mode 0600, `fstream keys new submitter`; default $FSTREAM_SUBMITTER_KEY_FILE)")
    p.add_argument("--idempotency-key", metavar="K", help="resubmitting the same key returns the same job")
    p.add_argument("--json", action="store_true", help="print one JSON object (the job) when done")
    p.add_argument("--progress", action="store_true", help="show the progress bar even when not on a terminal")
    p.add_argument("--timeout", metavar="DURATION", help="stop following after this long (the job continues)")
    _add_trust_option(p)
    from transfer_agent.cli.options import add_retention_option

    add_retention_option(p, "index entries older than this are dropped at submit (the agent that finishes the job "
                            "sets its expiry with its own --job-retention)")
    p.set_defaults(func=cmd_submit)
    return p


def _event_printer(progress: Any) -> Any:
    def on_event(_entry_id: str, ev: dict) -> None:
        kind = ev["kind"]
        if kind == "claimed":
            print(f"claimed by {ev.get('worker')} (attempt {ev.get('attempt')})", file=sys.stderr, flush=True)
        elif kind == "retry":
            print(f"retry {ev.get('try')} in {ev.get('delay', 0):.1f} s: {ev.get('message')}", file=sys.stderr,
                  flush=True)
        elif kind == "released":
            print(f"released: {ev.get('reason')} (another agent will take it)", file=sys.stderr, flush=True)
        elif kind in ("interval", "tuning", "file", "deadline"):
            progress(kind, ev)

    return on_event


def _finish_report(job: JobState, as_json: bool) -> int:
    if as_json:
        print(json.dumps(job.to_dict(), default=str), flush=True)
    elif job.result:
        from transfer_agent.cli.progress import print_summary

        try:
            print_summary(job.result)
        except (KeyError, TypeError):
            print(json.dumps(job.result, default=str), file=sys.stderr)
    if job.state == "succeeded":
        return EXIT_OK
    if job.terminal:
        print(f"fstream submit: job {job.job_id} {job.state}: {job.error or 'no reason recorded'}", file=sys.stderr)
    else:
        print(f"fstream submit: job {job.job_id} still {job.state}; follow it with `fstream status {job.job_id}`",
              file=sys.stderr)
    return EXIT_FAILED


def cmd_submit(args: argparse.Namespace) -> int:
    from transfer_agent.cli.options import spec_from_args

    from fstream_provider.authz.signing import resolve_signer

    spec = spec_from_args(args, job=True)
    try:
        signer = resolve_signer(args.submitter, args.submitter_key)
    except ValueError as exc:
        raise FStreamError(f"fstream submit: {exc}") from None
    store = _store(args, signer)
    store.trust = _trust(args)  # issue 40: only an outcome a trusted agent signed ends the follow
    job_id, created = store.submit(spec, idempotency_key=args.idempotency_key)
    note = "queued" if created else "already submitted with this idempotency key"
    print(f"job {job_id}: {note}", file=sys.stderr, flush=True)
    if not _live_agents(store):
        print("warning: no agent is running on this Redis; start one with `fstream agent`", file=sys.stderr)
    if args.detach:
        if args.json:
            print(json.dumps({"job_id": job_id, "created": created, "state": store.get(job_id).state}), flush=True)
        else:
            print(job_id, flush=True)
        return EXIT_OK
    from transfer_agent.cli.progress import Progress

    progress = Progress(not args.json and (args.progress or sys.stderr.isatty()))
    from fstream_provider.bus.follow import follow_job
    from fstream_provider.bus.job_state import JobLostError, JobNotFoundError

    try:
        job = follow_job(store, job_id, on_event=_event_printer(progress),
                         timeout=parse_duration(args.timeout) if args.timeout else None)
    except (JobNotFoundError, JobLostError) as exc:
        raise FStreamError(str(exc)) from exc
    except KeyboardInterrupt:
        print(f"\nstopped following; job {job_id} continues (`fstream cancel {job_id}` to cancel)", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        progress.stop()
    return _finish_report(job, args.json)


# -- status ----------------------------------------------------------------------------------------
def add_status_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("status", help="show one job, or the latest jobs and the live agents")
    p.add_argument("job", nargs="?", metavar="JOB", help="job id")
    _common(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--limit", type=int, default=20, help="how many jobs to list (default 20)")
    _add_trust_option(p)
    p.set_defaults(func=cmd_status)
    return p


def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    store = _store(args)
    store.trust = _trust(args)  # issue 40: a success no trusted agent signed shows as 'unverified'
    console = Console()
    if args.job:
        job = store.get(args.job)
        if job is None:
            raise FStreamError(f"job {args.job}: not found (unknown id, expired, or another Redis/namespace)")
        if args.json:
            from fstream_provider.bus.live import job_row

            print(json.dumps({**job.to_dict(), "live": job_row(job)}, default=str))
            return EXIT_OK
        t = Table(title=f"job {job.job_id}", show_header=False)
        t.add_column("field", no_wrap=True)
        t.add_column("value", overflow="fold")
        shown = job.state + (f" (agent {job.outcome_agent}, signed)" if job.outcome_agent else "")
        if job.unverified:
            shown += f": {job.unverified}"
        rows = [("state", shown), ("attempt", str(job.attempt)), ("deliveries", str(job.deliveries)),
                ("worker", job.worker or "-"), ("created", _when(job.created_at)), ("updated", _when(job.updated_at)),
                ("sources", " ".join(job.spec.sources)), ("destination", job.spec.destination),
                ("tuner", job.spec.tuner),
                ("submitter", f"{job.submitter} (signed; agents verify)" if job.submitter else "- (unsigned)"),
                ("idempotency key", job.idempotency_key or "-"), ("cancel requested", str(job.cancel_requested)),
                ("error", job.error or "-")]
        if job.progress:
            p = job.progress
            rows.append(("progress", f"{p.get('files_done', '?')}/{p.get('files_total', '?')} files, "
                                     f"{p.get('throughput_bps', 0) / 1e6:.1f} Mbit/s, "
                                     f"cc={p.get('cc')} p={p.get('p')} pp={p.get('pp')}"))
        if job.result:
            r = job.result
            rows.append(("result", f"{r.get('verified_files', 0)} verified, {r.get('skipped_files', 0)} skipped, "
                                   f"{r.get('failed_files', 0)} failed, {r.get('bytes', 0)} bytes in "
                                   f"{r.get('seconds', 0):.2f} s"))
        for name, value in rows:
            t.add_row(name, value)
        console.print(t)
        return EXIT_OK
    from fstream_provider.authz.outcome import trusted_view

    jobs = [trusted_view(j, store.keys.namespace, store.trust) for j in store.list(limit=args.limit)]
    agents = _live_agents(store)
    if args.json:  # "live": the rows of `fstream top` and the Airflow view (running, queued, then finished)
        from fstream_provider.bus.live import overview

        live = overview(store.client, store.keys, limit=args.limit,
                        owner=store.signer.submitter if store.signer else None)["jobs"]
        print(json.dumps({"jobs": [j.to_dict() for j in jobs], "agents": agents, "live": live,
                          "dead_letters": [{"id": i, **f} for i, f in store.dead_letters()]}, default=str))
        return EXIT_OK
    t = Table(title="fstream jobs")
    show_errors = any(j.error for j in jobs)
    for col in ("job", "state", "try", "worker", "created (UTC)"):
        t.add_column(col, no_wrap=True)
    t.add_column("destination", overflow="fold")
    if show_errors:
        t.add_column("error", overflow="fold")
    for j in jobs:
        row = [j.job_id, j.state, str(j.attempt), j.worker or "-", _when(j.created_at)[5:], j.spec.destination]
        t.add_row(*row, *([(j.error or "")[:80]] if show_errors else []))
    console.print(t)
    dead = store.dead_letter_count()  # None: a submitter's Redis user may not read them (issue 40)
    if dead:
        console.print(f"dead-lettered jobs: {dead} (stream {store.keys.dead_letter()})")
    if agents:
        console.print("agents: " + ", ".join(f"{a.get('name')} (job {a.get('job_id') or '-'})" for a in agents))
    else:
        console.print("agents: none alive (start one with `fstream agent`)")
    return EXIT_OK


# -- cancel ----------------------------------------------------------------------------------------
def add_cancel_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("cancel", help="cancel a job (queued: at once; running: its agent stops it)")
    p.add_argument("job", metavar="JOB", help="job id")
    _common(p)
    p.add_argument("--reason", default="cancelled by user", help="recorded as the job's error")
    from transfer_agent.cli.options import add_retention_option

    add_retention_option(p, "set on a queued job this cancels (a running one is finished by its agent)")
    p.set_defaults(func=cmd_cancel)
    return p


def cmd_cancel(args: argparse.Namespace) -> int:
    store = _store(args)
    job = store.get(args.job)
    if job is None:
        raise FStreamError(f"job {args.job}: not found (unknown id, expired, or another Redis/namespace)")
    if not store.cancel(args.job, args.reason):
        job = store.get(args.job) or job
        print(f"fstream cancel: job {args.job} already {job.state}; nothing to cancel", file=sys.stderr)
        return EXIT_FAILED
    job = store.get(args.job) or job
    if job.state == "cancelled":
        print(f"job {args.job}: cancelled")
    else:
        print(f"job {args.job}: cancel requested; agent {job.worker or '?'} will stop it")
    return EXIT_OK
