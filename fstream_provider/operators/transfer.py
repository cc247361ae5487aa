"""``FStreamTransferOperator``: submit an FStream transfer job, wait (deferred) for it, log what moved and why."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowException, AirflowSkipException, TaskDeferralTimeout

from fstream_provider.hooks.fstream import DEFAULT_CONN_ID, FStreamHook
from fstream_provider.model.options import TunerOptions
from fstream_provider.bus.agents import NoAgentError, NoAgentWatch, live_agents, start_agent_hint
from fstream_provider.bus.client import REDIS_UNREACHABLE
from fstream_provider.bus.outage import BusOutageError, Outage
from fstream_provider.model.units import parse_duration
from fstream_provider.model.tasklog import build_report, live_event_line, summary_table, target_warnings
from fstream_provider.operators._arguments import (  # noqa: F401  (normalize_sources, to_unix_time: public here too)
    check_at_parse, deadline_time, normalize_sources, rendered_bool, rendered_int, rendered_tuner_options,
    to_unix_time)
from fstream_provider.operators.links import PLOT_XCOM_KEY, FStreamPlotLink, plot_location, plot_url, write_plot

if TYPE_CHECKING:
    from airflow.sdk import Context

    from fstream_provider.model.spec import TransferSpec

TERMINAL = ("succeeded", "failed", "cancelled")
# spec options the operator takes as parameters, so they are refused inside ``tuner_options``
_OWN_PARAMETERS = ("sources", "destination", "tuner", "target_throughput", "max_cc", "bandwidth", "rtt", "cc", "p",
                   "pp", "watch", "until", "idle_exit", "interval", "verify", "key", "priority_class")


def _spec_field(spec: Any, name: str) -> Any:
    if spec is None:
        return None
    if isinstance(spec, dict):
        return spec.get(name)
    return getattr(spec, name, None)


class FStreamTransferOperator(BaseOperator):
    """Move files with FStream: tuned parallel TCP channels, checksums, resume, live re-tuning.

    The task submits a job to the agents on the ``fstream`` connection's Redis with the idempotency key
    ``dag_id/run_id/task_id/map_index``, so a retry of the same task re-attaches to the job still
    queued or running instead of starting a second copy; once that job has *finished* (succeeded,
    failed or cancelled), a Clear or a retry submits a new job keyed with the try number and the
    work is redone (files already verified at the destination are skipped by the agent, so this is
    cheap). With ``deferrable=True`` it then defers to
    :class:`~fstream_provider.triggers.transfer.FStreamTransferTrigger` and frees its worker slot.
    When the job ends, the task log gets one line per measurement interval (throughput vs target,
    cc/p/pp per cluster, files done/pending, the tuner's reason for each change), a summary table,
    a warning if the target was missed, and the URL of a PNG plot (also the "Transfer plot" extra link).
    The XCom is the report: ``job_id``, ``files``, ``bytes``, ``seconds``, ``throughput_bps``,
    ``verified_files``, ``failed_files``, ``landed_files`` (destination URL, size, source of each file),
    ``timeline`` (statistics: interval count, min/max/mean throughput, final per-cluster layout, changes)
    and ``plot``; the full interval timeline stays in Redis and the plot. Outlet assets get an event whose
    ``extra`` lists the landed files; OpenLineage gets the source and landed files as datasets.

    :param sources: files, directories or globs on the source agent's host; or the XCom list from
        ``FStreamNewFilesSensor`` (a list of paths) or a trigger payload (``{"files": [...]}``).
    :param destination: ``fstream://HOST:PORT/DEST/PATH`` of the receiver.
    :param tuner: a built tuner (``fstream_provider.tuning.registry.TUNER_NAMES``): ``fstream`` (default),
        ``dynamic``, ``static``, ``fixed``, ``globus``, ``adaptivecc``.
    :param target_throughput: QoS target such as ``800Mbps`` (``fstream`` only; enables the QoS controller).
    :param max_cc: upper bound on concurrent channels.
    :param bandwidth: known path bandwidth such as ``1Gbit``.
    :param rtt: known round-trip time such as ``40ms``.
    :param cc: channels: the layout of ``fixed``, the starting point of ``fstream`` and ``adaptivecc``
        (``static``, ``dynamic`` and ``globus`` refuse it).
    :param p: TCP streams per channel (likewise).
    :param pp: files queued ahead per channel (likewise).
    :param watch: keep watching the sources and ship new files as they appear (a long-running stream).
    :param until: in watch mode, stop at this time (datetime, ISO string or UNIX seconds).
    :param idle_exit: in watch mode, stop after this long with nothing new (``5m``).
    :param interval: in watch mode, scan interval (``2s``).
    :param verify: end-to-end checksum per file.
    :param key: the id of the agents' keyring key the job authenticates to the receiver with (default: the
        connection's ``key`` extra, else the agents' ``default``). Jobs never name key files (issue 32).
    :param priority_class: ``interactive`` (default) or ``batch``: how agents scheduling with STEAL treat the
        job (batch uses what interactive jobs leave and never preempts; ``docs/scheduling.md``).
    :param deadline: land everything by then (issue 27; templated): a datetime, an ISO-8601 string or UNIX seconds,
        or a duration (``timedelta``, ``"2h"``) counted from the DAG run's start. It steers the ``fstream``
        tuner's QoS target to what the deadline needs, and says early (a WARNING in this log, a ``deadline`` job
        event) when even the path's best rate cannot meet it. Airflow's ``DeadlineAlert`` watches the whole run
        from outside and cannot move a running task; this one acts inside the transfer (``docs/airflow``).
    :param on_deadline_risk: ``warn`` (default) or ``fail``: what the agent does when the deadline cannot be met.
    :param tuner_options: the options without a parameter of their own
        (:class:`~fstream_provider.model.options.TunerOptions`: ``profile_interval``, ``sample_interval``,
        ``block_size``, ``tcp_buffer``, ``encrypt``, ``pool``, ``tls_cert``, ``tls_key``, ``tls_ca``, ``label``); unknown keys are refused.
    :param fstream_conn_id: the ``fstream`` connection.
    :param deferrable: wait in the triggerer instead of polling in the worker; the default is Airflow's
        ``[operators] default_deferrable`` (False unless set), as in official providers. Long streams
        should defer.
    :param agent_timeout: fail (and cancel the job) when it stays queued this long with no live agent on
        the bus (``5m`` default; None waits for ever); a warning at submit already says how to start one.
    :param cancel_on_kill: cancel the job when the task is killed or marked failed/success (default);
        False leaves it running.
    :param redis_outage_timeout: how long one Redis outage may last (``10m`` default, as the agent's
        ``redis_outage_s``; None waits for ever) while the task submits, follows or reads its job: it waits with
        backoff and goes on where it was (``bus.outage``), so a Redis restart or failover does not fail a task
        whose transfer succeeds. Past it the task fails with one line naming the Redis and the outage's length.
    :param poll_interval: seconds one poll may block in non-deferrable mode.
    :param plot_dir: also write the PNG plot here when the task finishes: a directory or an ``ObjectStoragePath``
        URL (``s3://``, ``file://``). Default none: the plot is drawn by the provider's Airflow plugin when first
        viewed (the task instance's "Transfer plot" tab and extra link), off the task's critical path.
    """

    template_fields: Sequence[str] = (
        "sources", "destination", "tuner", "target_throughput", "max_cc", "bandwidth", "rtt", "cc", "p", "pp",
        "watch", "until", "idle_exit", "interval", "verify", "key", "tuner_options", "agent_timeout",
        "plot_dir", "priority_class", "deadline", "on_deadline_risk", "redis_outage_timeout",
    )
    ui_color = "#c8e6f5"
    operator_extra_links = (FStreamPlotLink(),)

    def __init__(
        self,
        *,
        sources: Any,
        destination: str,
        tuner: str = "fstream",
        target_throughput: str | float | None = None,
        max_cc: int | None = None,
        bandwidth: str | float | None = None,
        rtt: str | float | None = None,
        cc: int | None = None,
        p: int | None = None,
        pp: int | None = None,
        watch: bool = False,
        until: Any = None,
        idle_exit: str | float | None = None,
        interval: str | float | None = None,
        verify: bool = True,
        key: str | None = None,
        priority_class: str = "interactive",
        deadline: Any = None,
        on_deadline_risk: str = "warn",
        tuner_options: dict[str, Any] | None = None,
        fstream_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 1.0,
        plot_dir: str | None = None,
        agent_timeout: str | float | None = "5m",
        cancel_on_kill: bool = True,
        redis_outage_timeout: str | float | None = "10m",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.sources = sources
        self.destination = destination
        self.tuner = tuner
        self.target_throughput = target_throughput
        self.max_cc = max_cc
        self.bandwidth = bandwidth
        self.rtt = rtt
        self.cc = cc
        self.p = p
        self.pp = pp
        self.watch = watch
        self.until = until
        self.idle_exit = idle_exit
        self.interval = interval
        self.verify = verify
        self.key = key
        self.priority_class = priority_class
        self.deadline = deadline
        self.on_deadline_risk = on_deadline_risk
        self.tuner_options = tuner_options or {}
        self.fstream_conn_id = fstream_conn_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.plot_dir = plot_dir
        self.agent_timeout = agent_timeout
        self.cancel_on_kill = cancel_on_kill
        self.redis_outage_timeout = redis_outage_timeout
        self._job_id: str | None = None
        self._check_options()

    def _check_options(self) -> None:
        """Refuse at DAG parse what is known then (``_arguments.check_at_parse``: pure and cheap, no I/O)."""
        check_at_parse(self, _OWN_PARAMETERS)

    @cached_property
    def hook(self) -> FStreamHook:
        return FStreamHook(fstream_conn_id=self.fstream_conn_id)

    # -- building and submitting -------------------------------------------------------------
    def build_spec(self, context: Context | None = None) -> "TransferSpec":
        from fstream_provider.model.spec import TransferSpec

        sources = normalize_sources(self.sources)
        if not sources:
            raise AirflowSkipException(f"{self.task_id}: no sources to transfer (empty list)")
        label = ""
        if context is not None:
            ti = context["ti"]
            label = f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}"
        try:
            opts = TunerOptions.check(rendered_tuner_options(self.task_id, self.tuner_options),
                                      own_parameters=_OWN_PARAMETERS).as_options()
        except ValueError as exc:
            raise AirflowException(f"{self.task_id}: invalid transfer options: {exc}") from None
        cc, p, pp, max_cc = (rendered_int(self.task_id, n, getattr(self, n)) for n in ("cc", "p", "pp", "max_cc"))
        try:
            deadline = deadline_time(self.deadline, context)
        except ValueError as exc:
            raise AirflowException(f"{self.task_id}: invalid transfer options: {exc}") from None
        opts.update(
            tuner=self.tuner, target_throughput=self.target_throughput or None, max_cc=max_cc,
            bandwidth=self.bandwidth or None, rtt=self.rtt or None, cc=cc, p=p, pp=pp,
            watch=rendered_bool(self.task_id, "watch", self.watch), until=to_unix_time(self.until),
            idle_exit=self.idle_exit or None, interval=self.interval or None,
            verify=rendered_bool(self.task_id, "verify", self.verify),
            key=self.key or None, label=opts.get("label") or label,
            priority_class=self.priority_class or "interactive",
            deadline=deadline, on_deadline_risk=self.on_deadline_risk or "warn",
        )
        try:
            return TransferSpec.from_options(sources, self.destination, **opts)
        except ValueError as exc:
            raise AirflowException(f"{self.task_id}: invalid transfer options: {exc}") from None

    @staticmethod
    def idempotency_key(context: Context) -> str:
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{-1 if map_index is None else map_index}"

    def submit(self, spec: "TransferSpec", context: Context) -> str:
        """Submit the task's job, or re-attach to the task's newest job if it is still queued or running.

        The first job goes under ``dag_id/run_id/task_id/map_index``, each redo under that key plus
        ``#tryN`` (Airflow raises the try number on every retry and Clear; ``#tryN.2``... when the same try
        runs again, as when a run is deleted and recreated under its run_id). The newest of these decides:
        queued/running is re-attached (a retry must not start a second copy), finished or vanished is
        redone under the next key (the agent skips files already verified at the destination).
        """
        base = self.idempotency_key(context)
        try_number = max(1, int(getattr(context["ti"], "try_number", 1) or 1))
        keys = ([base] + [f"{base}#try{n}" for n in range(1, try_number + 1)]
                + [f"{base}#try{try_number}.{r}" for r in range(2, 10)])
        found = [(i, j) for i, j in enumerate(self.hook.jobs_under_keys(keys)) if j]
        key, job_id, created = base, None, False
        if found:
            last, last_id = found[-1]
            job = self.hook.get_job(last_id)
            state = getattr(job, "state", None)
            nxt = max(last + 1, try_number)  # keys[try_number] is base#tryN
            if (job is not None and state not in TERMINAL) or nxt >= len(keys):
                self.log.info("Re-attached to existing FStream job %s (%s) for %s: no second copy started",
                              last_id, state, keys[last])
                job_id = last_id
            else:
                key = keys[nxt]
                self.log.warning("FStream job %s for %s %s (%s); submitting a new job (key %s)", last_id, keys[last],
                                 f"ended {state}" if job is not None else "vanished from the bus",
                                 getattr(job, "error", None) or "no error text", key)
        if job_id is None:
            job_id, created = self.hook.submit(spec, idempotency_key=key)
        if created:
            self.log.info("Submitted FStream job %s (%s -> %s, tuner %s) on %s", job_id,
                          ", ".join(spec.sources[:3]) + (" ..." if len(spec.sources) > 3 else ""),
                          spec.destination, spec.tuner, self.hook.settings.source)
        try:
            alive = live_agents(self.hook.client, self.hook.keys)
        except REDIS_UNREACHABLE as exc:  # the job is in; retrying the submission for a warning could double it
            self.log.warning("could not look for live FStream agents on %s (%s); job %s is queued",
                             self.hook.settings.source, exc, job_id)
            alive = True
        if not alive:
            timeout = self._agent_timeout()
            self.log.warning("No FStream agent is alive on %s: job %s waits in the queue%s; %s",
                             self.hook.settings.source, job_id,
                             f" and fails after agent_timeout {timeout:g} s" if timeout is not None else "",
                             self._agent_hint())
        return job_id

    def _agent_timeout(self) -> float | None:
        if self.agent_timeout in (None, "", "None"):
            return None
        try:
            return parse_duration(self.agent_timeout)
        except ValueError as exc:
            raise AirflowException(f"{self.task_id}: agent_timeout {self.agent_timeout!r}: {exc}") from None

    def _outage_timeout(self) -> float | None:
        if self.redis_outage_timeout in (None, "", "None"):
            return None
        try:
            return parse_duration(self.redis_outage_timeout)
        except ValueError as exc:
            raise AirflowException(f"{self.task_id}: redis_outage_timeout {self.redis_outage_timeout!r}: {exc}"
                                   ) from None

    def _through_outage(self, what: str, fn: Any) -> Any:
        """``fn()``, riding out a Redis outage (``bus.outage``); past the budget one line, no traceback."""
        from fstream_provider.bus.client import describe

        outage = Outage(self._outage_timeout(), what, self.log, where=f"Redis {describe(self.hook.settings.redis_url)}")
        try:
            return outage.call(fn)
        except BusOutageError as exc:
            raise AirflowException(str(exc)) from None

    def _agent_hint(self) -> str:
        from fstream_provider.bus.client import describe

        return start_agent_hint(describe(self.hook.settings.redis_url), self.hook.settings.namespace)

    # -- running ------------------------------------------------------------------------------
    def execute(self, context: Context) -> dict[str, Any]:
        spec = self.build_spec(context)
        job_id = self._job_id = self._through_outage("submitting the FStream job", lambda: self.submit(spec, context))
        context["ti"].xcom_push(key="job_id", value=job_id)
        context["ti"].xcom_push(key="fstream_conn_id", value=self.fstream_conn_id)  # the plugin's plot reads it
        if self.deferrable:
            from fstream_provider.triggers.transfer import FStreamTransferTrigger

            self.defer(
                trigger=FStreamTransferTrigger(job_id=job_id, fstream_conn_id=self.fstream_conn_id,
                                               target_throughput_bps=spec.target_throughput_bps,
                                               agent_timeout=self._agent_timeout(), agent_hint=self._agent_hint(),
                                               cancel_on_kill=bool(self.cancel_on_kill),
                                               redis_outage_timeout=self._outage_timeout()),
                method_name="execute_complete",
                timeout=self.execution_timeout,
            )
        return self._poll(job_id, spec.target_throughput_bps, context)

    def _poll(self, job_id: str, target_bps: float | None, context: Context) -> dict[str, Any]:
        from fstream_provider.bus.follow import follow_job

        prev, seen = None, []
        outage: Outage | None = None

        def on_event(eid: str, ev: dict[str, Any]) -> None:
            nonlocal prev
            if outage is not None:
                outage.recovered()  # events came: an outage in progress is over (a busy job's reads are never empty)
            seen.append((eid, ev))
            line = live_event_line(ev, target_bps, prev)  # the same lines, at the same levels, as the trigger's
            if line is not None:
                self.log.log(*line)
            if ev.get("kind") == "interval":
                prev = ev

        watch = NoAgentWatch(self._agent_timeout(), self._agent_hint())

        def on_idle(state: Any) -> None:
            if state.state == "queued":  # only then is a missing agent a reason to give up
                watch.check(job_id, state.state, len(live_agents(self.hook.client, self.hook.keys)))

        from fstream_provider.bus.client import describe

        outage = Outage(self._outage_timeout(), f"following FStream job {job_id}", self.log,
                        where=f"Redis {describe(self.hook.settings.redis_url)}")

        def recovered(state: Any) -> None:
            outage.recovered()
            on_idle(state)

        try:
            while True:  # an outage: wait, then follow on from the last event handled (none lost or repeated)
                try:
                    follow_job(self.hook.store, job_id, on_event=on_event, after=seen[-1][0] if seen else "0-0",
                               block_ms=max(1, int(self.poll_interval * 1000)), on_idle=recovered)
                    break
                except REDIS_UNREACHABLE as exc:
                    time.sleep(outage.failed(exc))
        except BusOutageError as exc:
            raise AirflowException(str(exc)) from None
        except NoAgentError as exc:
            self._through_outage(f"cancelling FStream job {job_id}", lambda: self.hook.cancel(job_id, str(exc)))
            raise AirflowException(str(exc)) from None
        except LookupError as exc:  # JobLostError (or JobNotFoundError): its state vanished from the bus
            raise AirflowException(f"FStream job {job_id} disappeared from the bus while running: its state "
                                   "vanished from Redis (flushed, or restarted without its data); "
                                   "`fstream reconcile` reports what is left, a task retry resubmits it") from exc
        return self._finish(job_id, seen, target_bps, context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the trigger: write the summary (the trigger already logged every event line live).

        The interval, retry and error lines are not repeated here: the triggerer wrote them into this task's
        log as they happened. If that part of the log is missing (a triggerer restarted without shipping
        its log), the summary still gives the interval count, final per-cluster layout and changes, the
        plot has the whole timeline, and ``fstream status JOB`` replays the events from Redis.
        """
        job_id = event.get("job_id") or self._job_id
        if not job_id:
            raise AirflowException(f"{self.task_id}: trigger returned no job id ({event.get('message')})")
        if event.get("outage"):  # the trigger already waited out its budget: say so in one line
            raise AirflowException(event.get("message") or f"Redis unreachable while following FStream job {job_id}")
        events = self._through_outage(f"reading FStream job {job_id}'s events", lambda: self.hook.all_events(job_id))
        job = self._through_outage(f"reading FStream job {job_id}", lambda: self.hook.get_job(job_id))
        target = _spec_field(getattr(job, "spec", None), "target_throughput_bps")
        if event.get("status") != "success" and not any(e.get("kind") == "done" for _, e in events):
            raise AirflowException(event.get("message") or f"FStream job {job_id} failed")
        return self._finish(job_id, events, target, context)

    def _finish(self, job_id: str, events: list[tuple[str, dict[str, Any]]], target_bps: float | None,
                context: Context) -> dict[str, Any]:
        """Summary table, target warnings, plot, XCom report and asset events; raise if the job did not succeed.

        Event lines were logged live (``live_event_line``), so only the summary is written here.
        """
        from fstream_provider.model.plot import plot_png
        from fstream_provider.model.tasklog import intervals_from_events

        job = self._through_outage(f"reading FStream job {job_id}", lambda: self.hook.get_job(job_id))
        # issue 40: state, error, result and landed files as a trusted agent signed them (the hook's store verifies;
        # a success none signed reads 'unverified' with no result), never the event stream's unsigned 'done'
        # an unsigned failure keeps its own reason (a cancel by this task says why); an unsigned success says why not
        error = job.unverified if job is not None and job.state == "unverified" else getattr(job, "error", None)
        outcome = ({"state": job.state, "error": error, "result": job.result}
                   if job is not None else {"state": None, "error": "the job is gone from the bus", "result": None})
        report = build_report(job_id, events, target_bps, _spec_field(getattr(job, "spec", None), "destination"),
                              outcome=outcome)
        report["agent"] = getattr(job, "worker", None)
        intervals = intervals_from_events(events)
        self.log.info("FStream job %s: %d interval line(s) above (logged live); summary:", job_id, len(intervals))
        for line in summary_table(report, intervals, target_bps, job_id=job_id).splitlines():
            self.log.info("%s", line)
        for w in target_warnings(report, intervals, target_bps):
            self.log.warning("%s", w)
        ti = context["ti"]
        report["plot"] = plot_url(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1))
        if self.plot_dir:  # a file was asked for: drawn here (~1 s); otherwise the plugin draws it when viewed
            try:
                data = plot_png(intervals, target_bps, title=f"FStream job {job_id} ({self.task_id})")
                if data:
                    report["plot"] = write_plot(self._plot_path(context, job_id), data)
            except Exception as exc:  # a plot must never fail a transfer that succeeded
                self.log.warning("could not save the throughput plot: %s", exc)
        if report["plot"]:
            self.log.info("Throughput/channels plot: %s", report["plot"])
            context["ti"].xcom_push(key=PLOT_XCOM_KEY, value=report["plot"])
        self._report = report
        if report["state"] != "succeeded":
            raise AirflowException(f"FStream job {job_id} {report['state']}: {report['error'] or 'no error text'}")
        if report["failed_files"]:
            raise AirflowException(f"FStream job {job_id}: {report['failed_files']} file(s) failed: "
                                   f"{report['failures'][:5]}")
        self._emit_asset_events(context, report)
        return report

    def _emit_asset_events(self, context: Context, report: dict[str, Any]) -> None:
        from fstream_provider.operators.lineage import emit_asset_events

        emit_asset_events(getattr(self, "outlets", None), context, report)

    def _plot_path(self, context: Context, job_id: str):
        """``plot_dir/dag/run/task-job.png`` as an ``ObjectStoragePath`` (default ``$FSTREAM_STATE_DIR/plots``)."""
        base = self.plot_dir
        if not base:
            from fstream_provider.model.statedir import state_dir

            base = os.path.join(state_dir(), "plots")
        ti = context["ti"]
        return plot_location(base, ti.dag_id, ti.run_id, ti.task_id, job_id)

    def get_openlineage_facets_on_complete(self, task_instance: Any):
        """OpenLineage: inputs ``file://<agent host>/<source>``, outputs ``fstream://host:port/<dest path>``."""
        from fstream_provider.operators.lineage import operator_lineage

        report = getattr(self, "_report", None)
        if report is None:
            report = task_instance.xcom_pull(task_ids=self.task_id, key="return_value")
        return operator_lineage(report)

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """As Airflow's, plus: a deferral that timed out (``execution_timeout``) cancels the job it waited for."""
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except TaskDeferralTimeout:
            ti = context["ti"]
            job_id = ti.xcom_pull(task_ids=self.task_id, key="job_id", map_indexes=getattr(ti, "map_index", None))
            if job_id:
                self.log.warning("Timed out waiting for FStream job %s: cancelling it", job_id)
                self.hook.cancel(job_id, f"Airflow task {self.task_id} timed out (execution_timeout)")
            raise

    def on_kill(self) -> None:
        """Cancel the job when the task is killed while polling (deferred tasks: the trigger's ``on_kill``).

        With ``cancel_on_kill=False`` the job keeps running (a long stream that must outlive the task).
        """
        if self._job_id and self.cancel_on_kill:
            self.log.info("Cancelling FStream job %s", self._job_id)
            self.hook.cancel(self._job_id, f"Airflow task {self.task_id} was killed")
