"""``FStreamNewFilesSensor``: wait for new, complete files (local or SFTP) and return them as XCom, each once."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowException

from fstream_provider.bus.client import REDIS_UNREACHABLE
from fstream_provider.bus.outage import BusOutageError, Outage, first_line
from fstream_provider.hooks.fstream import DEFAULT_CONN_ID, FStreamHook
from fstream_provider.hooks.sftp import Scanner
from fstream_provider.watch.adopt import adopt, hint
from fstream_provider.watch.location import Location, default_poll_interval, default_scope
from fstream_provider.watch.seen import RedisSeenStore
from fstream_provider.watch.watcher import Watcher, batch_payload

if TYPE_CHECKING:
    from airflow.sdk import Context

LOOKS_MAX = 10_000  # files whose last look is kept in Redis between pokes (~1 MB of JSON at most)
ACK_OUTAGE_S = 60.0  # how long execute_complete waits out a Redis outage to acknowledge its batch


class FStreamNewFilesSensor(BaseSensorOperator):
    """Succeed with the list of new complete files matching ``pattern``; a file is never returned twice.

    "Seen" lives in a Redis set on the ``fstream`` connection (scope: ``scope``, or derived from path,
    pattern and recursive), so retries, reruns, restarts and parallel sensors agree. The XCom value
    is the list of paths, ready for ``FStreamTransferOperator(sources=sensor.output)``. With
    ``deferrable=True`` it waits in the triggerer via
    :class:`~fstream_provider.triggers.new_files.FStreamNewFilesTrigger`.

    :param path: local directory, or ``sftp://USER@HOST:PORT/DIR``.
    :param pattern: glob on the relative path or the file name.
    :param recursive: descend into subdirectories.
    :param scope: seen-set name (default derived from path, pattern, recursive).
    :param min_files: succeed once this many new complete files exist.
    :param max_files: at most this many files per batch (oldest first).
    :param min_age: files older than this many seconds count as complete on the first look.
    :param fstream_conn_id: the ``fstream`` connection (Redis with the seen-set).
    :param ssh_key_file: private key for SFTP.
    :param known_hosts: known_hosts file for SFTP (default: the system's; unknown keys are refused).
    :param deferrable: wait in the triggerer instead of poking from a worker (default: Airflow's
        ``[operators] default_deferrable``, False unless set, as in official providers). Poking works in
        ``mode="poke"`` and ``mode="reschedule"``: both keep the stability looks in Redis, so a
        rescheduled poke in a new process still sees a file that held still.
    :param poke_interval: seconds between looks (default 0.25 s local, 5 s for ``sftp://``).
    """

    template_fields: Sequence[str] = ("path", "pattern", "scope", "min_files", "max_files")
    ui_color = "#e3f2e1"

    def __init__(self, *, path: str, pattern: str = "*", recursive: bool = False, scope: str | None = None,
                 min_files: int = 1, max_files: int | None = None, min_age: float = 0.0,
                 fstream_conn_id: str = DEFAULT_CONN_ID, ssh_key_file: str | None = None,
                 known_hosts: str | None = None,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 poke_interval: float | None = None,
                 **kwargs: Any) -> None:
        super().__init__(poke_interval=default_poll_interval(path, poke_interval), **kwargs)
        self._poke_interval_given = poke_interval
        self.path = path
        self.pattern = pattern
        self.recursive = recursive
        self.scope = scope
        self.min_files = min_files
        self.max_files = max_files
        self.min_age = min_age
        self.fstream_conn_id = fstream_conn_id
        self.ssh_key_file = ssh_key_file
        self.known_hosts = known_hosts
        self.deferrable = deferrable

    @cached_property
    def hook(self) -> FStreamHook:
        return FStreamHook(fstream_conn_id=self.fstream_conn_id)

    @cached_property
    def scanner(self) -> Scanner:
        return Scanner(Location.parse(self.path), pattern=self.pattern, recursive=self.recursive,
                       key_file=self.ssh_key_file, known_hosts=self.known_hosts)

    @cached_property
    def watcher(self) -> Watcher:
        self._adopt()
        store = RedisSeenStore.scoped(self.hook.client, self.hook.keys, self.scope_key())
        return Watcher(self.scanner, store=store, min_age=self.min_age)

    def _adopt(self) -> None:
        """The scope's state from before issue 40 carried into the submitter's own (``watch.adopt``), once."""
        scope, owned = self.effective_scope(), self.scope_key()
        done = adopt(self.hook.client, self.hook.keys, scope, owned)
        if done is None:
            self.log.warning("%s", hint(scope, self.hook.settings.submitter or ""))
        elif done:
            self.log.info("new-files scope %r: carried over %s from before issue 40", scope, done)

    def effective_scope(self) -> str:
        return self.scope or default_scope(self.path, self.pattern, self.recursive)

    def scope_key(self) -> str:
        """The scope as its Redis keys name it: the connection's submitter's own (``FStreamSettings.scope_key``)."""
        return self.hook.settings.scope_key(self.effective_scope())

    def _counts(self) -> tuple[int, int | None]:
        """``min_files``/``max_files`` as integers (they may arrive as rendered template strings)."""
        try:
            low = int(self.min_files)
            high = int(self.max_files) if self.max_files not in (None, "", "None") else None
        except (TypeError, ValueError):
            raise AirflowException(f"{self.task_id}: min_files {self.min_files!r} / max_files {self.max_files!r} "
                                   "must be integers") from None
        return low, high

    def execute(self, context: Context) -> Any:
        # ``path`` may have been a template: choose the local/remote default from the rendered one
        self.poke_interval = default_poll_interval(self.path, self._poke_interval_given)
        if not self.deferrable:
            return super().execute(context)
        from fstream_provider.triggers.new_files import FStreamNewFilesTrigger

        min_files, max_files = self._counts()
        self.defer(
            trigger=FStreamNewFilesTrigger(
                path=self.path, pattern=self.pattern, recursive=self.recursive, scope=self.scope,
                min_files=min_files, max_files=max_files, poll_interval=float(self.poke_interval),
                min_age=self.min_age, fstream_conn_id=self.fstream_conn_id, ssh_key_file=self.ssh_key_file,
                known_hosts=self.known_hosts),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def poke(self, context: Context) -> PokeReturnValue:
        """One look (``_look``); while Redis is unreachable a poke finds nothing and says so (a WARNING), so a
        Redis restart or failover costs a few pokes, never the task: the sensor's ``timeout`` still bounds it."""
        try:
            return self._look()
        except REDIS_UNREACHABLE as exc:
            self.log.warning("Redis unreachable while watching %s (%s: %s); poking again in %s s", self.path,
                             type(exc).__name__, first_line(exc), self.poke_interval)
            return PokeReturnValue(is_done=False)

    def _look(self) -> PokeReturnValue:
        """One look. The previous look (what makes a file "held still") is kept in Redis, not in this
        object: with ``mode="reschedule"`` every poke runs in a new process, and a sensor that kept it
        in memory never saw a file twice, so it timed out on a complete file.

        Why Redis and not the file's age: an age rule (mtime older than N s) reports a file whose writer
        paused longer than N s, and needs an N per instrument; two looks with the same size and mtime
        is the rule the trigger and the agent use, so all three agree on "complete". The looks live in
        ``looks:<scope>`` (one JSON value, at most ``LOOKS_MAX`` files, expiring after max(1 h, 10 poke
        intervals)); ``min_age`` still lets old files count on the first look."""
        min_files, max_files = self._counts()
        client, looks_key = self.hook.client, self.hook.keys.looks(self.scope_key())
        raw = client.get(looks_key)
        self.watcher.tracker.load(json.loads(raw) if raw else None)
        won = self.watcher.poll(min_files, max_files)
        try:  # bounded: only files not yet complete or claimed; kept long enough to span a rescheduled poke
            client.set(looks_key, json.dumps(self.watcher.tracker.export(limit=LOOKS_MAX)),
                       ex=int(max(3600, 10 * float(self.poke_interval))))
        except REDIS_UNREACHABLE as exc:  # the batch is claimed: return it (the looks are only an optimisation)
            self.log.warning("could not keep this poke's looks in Redis (%s: %s)", type(exc).__name__,
                             first_line(exc))
        if self.watcher.last_complete < min_files:
            self.log.info("%d new complete file(s) in %s, waiting for %d", self.watcher.last_complete, self.path,
                          min_files)
            return PokeReturnValue(is_done=False)
        if not won:
            return PokeReturnValue(is_done=False)
        payload = batch_payload(won, scope=self.effective_scope(), location=self.scanner.location.url())
        self.scanner.close()
        self.log.info("%s: %s", payload["message"], ", ".join(payload["files"][:10]))
        return PokeReturnValue(is_done=True, xcom_value=payload["files"])

    def execute_complete(self, context: Context, event: dict[str, Any]) -> list[str]:
        if event.get("status") != "success":
            raise AirflowException(event.get("message") or "new-files trigger failed")
        if event.get("batch_id"):  # the task resumed with it: delivered (the trigger is not run again to ack it)
            pending, bid = self.hook.keys.pending(self.scope_key()), event["batch_id"]
            try:
                Outage(ACK_OUTAGE_S, f"acknowledging batch {bid}", self.log).call(
                    lambda: self.hook.client.hdel(pending, bid))
            except BusOutageError as exc:  # the files are this task's; unacknowledged, they may come again later
                self.log.warning("%s; the batch stays pending and may be delivered again (at-least-once)", exc)
        self.log.info("%s: %s", event.get("message"), ", ".join(event.get("files", [])[:10]))
        return list(event.get("files", []))
