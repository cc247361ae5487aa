"""``FStreamNewFilesTrigger``: fire once per batch of new, complete files (local or SFTP); drives an ``AssetWatcher``.

As an asset watcher it runs in Airflow 3.3's shared-stream *ack mode* (:mod:`airflow.triggers.shared_stream`):
one poll loop per key (:meth:`NewFilesProducer.open_stream`) yields ``(raw_event, broker_payload)``; the
trigger's ``filter_shared_stream`` turns each raw event into a ``TriggerEvent``; and once the subscriber moved
past the event **and the supervisor confirmed the trigger event persisted in the metadata database**, the
manager calls :meth:`NewFilesProducer.advance`. That is the hook after persistence the plain ``run()`` path
lacks, and it is where a batch is acknowledged (removed from ``pending(scope)``). A batch whose event was not
stored (ack timeout, persist failure, no subscriber online) is released and delivered again; a batch left
behind by a triggerer that died is taken again after ``redeliver_after`` by whichever watcher of the scope polls.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer
from redis.exceptions import RedisError

from fstream_provider.bus.outage import Outage
from fstream_provider.hooks.fstream import DEFAULT_CONN_ID
from fstream_provider.hooks.fstream_async import FStreamAsyncHook
from fstream_provider.hooks.sftp import Scanner
from fstream_provider.watch.adopt import aadopt, hint
from fstream_provider.watch.location import Location, default_poll_interval, default_scope
from fstream_provider.watch.pending import PendingBatches, normalize_identity
from fstream_provider.watch.watcher import Watcher, batch_payload

DEFAULT_REDELIVER_AFTER_S = 300.0  # = Airflow's [triggerer] shared_stream_ack_timeout default: a batch Airflow
                                   # may still confirm is never taken again by another watcher


WARN_EVERY_S = 60.0  # a missing directory or a Redis outage is logged once a minute, not every poll


class NewFilesWatch:
    """What one poll loop over a scope needs: scanner, async hook, pending store and watcher (opened lazily).

    The hook's client is the triggerer loop's shared one for the connection's Redis (``bus.aio_shared``): every
    watcher and transfer trigger on that loop polls over the same few connections; ``close`` gives it back.

    :param trigger: the trigger whose settings (path, pattern, scope, counts, identity...) this loop follows.
    """

    def __init__(self, trigger: Any) -> None:
        self.t = trigger
        normalize_identity(trigger.identity)  # checked before anything opens: a clear error naming it
        try:
            after = float(trigger.redeliver_after)
        except (TypeError, ValueError):
            after = -1.0
        if after < 0:
            raise ValueError(f"redeliver_after {trigger.redeliver_after!r}: must be a number of seconds >= 0")
        self.location = Location.parse(trigger.path)
        self.scope = self.scope_of(trigger)
        self.scanner = Scanner(self.location, pattern=trigger.pattern, recursive=trigger.recursive,
                               key_file=trigger.ssh_key_file, known_hosts=trigger.known_hosts)
        self.hook = FStreamAsyncHook(fstream_conn_id=trigger.fstream_conn_id)
        self.store: PendingBatches | None = None
        self.watcher: Watcher | None = None
        self._last_warning = 0.0

    @staticmethod
    def scope_of(trigger: Any) -> str:
        """The trigger's ``scope``, or the one derived from path, pattern and recursive."""
        return trigger.scope or default_scope(trigger.path, trigger.pattern, trigger.recursive)

    async def open(self) -> PendingBatches:
        if self.store is None:
            client, keys = await self.hook.get_client(), await self.hook.get_keys()
            settings = await self.hook.get_settings()
            scope = settings.scope_key(self.scope)  # the submitter's own keys (issue 40)
            done = await aadopt(client, keys, self.scope, scope)  # the scope's state from before, once
            if done is None:
                self.t.log.warning("%s", hint(self.scope, settings.submitter or ""))
            elif done:
                self.t.log.info("new-files scope %r: carried over %s from before issue 40", self.scope, done)
            self.store = PendingBatches(client, keys.seen(scope), keys.pending(scope), self.t.identity)
            self.watcher = Watcher(self.scanner, store=self.store, min_age=self.t.min_age)
        return self.store

    def payload(self, files: list, batch_id: str, *, redelivered: bool = False) -> dict[str, Any]:
        body = dict(batch_payload(files, scope=self.scope, location=self.location.url()), batch_id=batch_id)
        return dict(body, redelivered=True) if redelivered else body

    async def next_batch(self, exclude: Sequence[str] = ()) -> dict[str, Any] | None:
        """One look: a batch due for redelivery (not in ``exclude``), else a newly claimed batch, else ``None``.

        A missing directory, an SFTP or a Redis hiccup is logged (once a minute) and counts as nothing found."""
        try:
            store = await self.open()
            again = await store.take_redeliverable(float(self.t.redeliver_after), exclude)
            if again is not None:
                bid, files = again
                self.t.log.warning("re-delivering batch %s (%d file(s)) of scope %s: claimed, but Airflow never "
                                   "confirmed its event (a triggerer stopped, or the event was not stored)",
                                   bid, len(files), self.scope)
                return self.payload(files, bid, redelivered=True)
            assert self.watcher is not None
            won = await self.watcher.apoll(int(self.t.min_files), self.t.max_files)  # lists in a thread
            if won:
                return self.payload(won, str(store.last_batch_id))
        except (OSError, EOFError, RedisError) as exc:
            if time.monotonic() - self._last_warning > WARN_EVERY_S:
                self.t.log.warning("watching %s: %s (will keep retrying)", self.location.url(), exc)
                self._last_warning = time.monotonic()
        return None

    async def sleep(self) -> None:
        await asyncio.sleep(self.t.effective_poll_interval())

    async def close(self) -> None:
        await asyncio.to_thread(self.scanner.close)
        await self.hook.close()


class NewFilesProducer(SharedStreamProducer):
    """One scope's poll loop in the triggerer's ack mode; acknowledges a batch after Airflow stored its event.

    :param trigger: a trigger built from the group's kwargs (its settings drive the loop).
    """

    def __init__(self, trigger: Any) -> None:
        self.trigger = trigger
        self.watch: NewFilesWatch | None = None
        self.inflight: set[str] = set()  # yielded, not yet advanced: never taken again by this loop

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        self.watch = NewFilesWatch(self.trigger)
        self.trigger.log.info("watching %s for %r (scope %s, ack mode)", self.watch.location.url(),
                              self.trigger.pattern, self.watch.scope)
        while True:
            payload = await self.watch.next_batch(exclude=sorted(self.inflight))
            if payload is None:
                await self.watch.sleep()
                continue
            self.inflight.add(payload["batch_id"])
            self.trigger.log.info("%s (batch %s)", payload["message"], payload["batch_id"])
            yield payload, payload["batch_id"]

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Acknowledge the batches whose events Airflow stored; release the others for redelivery.

        A Redis outage is waited out (``bus.outage``) for up to ``redeliver_after``: after that the batch would be
        delivered again anyway, so waiting longer buys nothing (the error then reaches Airflow's manager)."""
        assert self.watch is not None and self.watch.store is not None
        store = self.watch.store
        for item in batch:
            batch_id, outcome = item.broker_payload, item.outcome
            outage = Outage(float(self.trigger.redeliver_after), f"acknowledging batch {batch_id}", self.trigger.log)
            if outcome.acked > 0:  # some subscriber's event for it is stored: delivered
                await outage.acall(lambda: store.ack(batch_id))
            else:  # not stored, or nobody was listening: deliver it again
                self.trigger.log.warning("batch %s was not stored by Airflow (%s): releasing it for re-delivery",
                                         batch_id, outcome)
                await outage.acall(lambda: store.release(batch_id))
            self.inflight.discard(batch_id)

    async def aclose(self) -> None:
        if self.watch is not None:
            await self.watch.close()


class FStreamNewFilesTrigger(BaseEventTrigger):
    """Yield one event ``{"status", "message", "files", "details", "bytes", "scope", "location", "batch_id"}``
    per batch.

    Files count once they are complete (size and mtime unchanged between two looks ``poll_interval``
    apart, or older than ``min_age``) and not yet in the scope's Redis seen-set. A batch is claimed in
    that set (``SADD``), so a file is claimed once across restarts, duplicate triggers and the re-runs
    of an ``AssetWatcher`` (apache/airflow issue 49900: the memory lives in Redis, not in the trigger).
    The same Lua call records the batch as *pending* (:mod:`fstream_provider.watch.pending`) under a
    random ``batch_id``; it leaves ``pending`` only when its delivery is acknowledged:

    * **as an asset watcher** the trigger runs in Airflow 3.3's shared-stream *ack mode*
      (:class:`NewFilesProducer`): the batch is acknowledged after the
      triggerer's supervisor confirmed the asset event stored in the metadata database; an event
      that was not stored is delivered again at once;
    * **deferred by** :class:`~fstream_provider.sensors.new_files.FStreamNewFilesSensor`, the
      sensor's ``execute_complete`` acknowledges it (the task resumed with it).

    A batch not acknowledged ``redeliver_after`` seconds after its last delivery (its triggerer died,
    or the deferred task never resumed) is delivered again, with the same ``batch_id`` and
    ``"redelivered": true``. The guarantee is **at-least-once** delivery of each batch with a stable
    ``batch_id``: exactly once per file version for consumers that skip a ``batch_id`` they already
    handled. A duplicate needs a crash (or an event not acknowledged within ``redeliver_after``).

    Use it in an asset watcher::

        Asset("lcls-run-42", watchers=[AssetWatcher(name="lcls_new_files",
              trigger=FStreamNewFilesTrigger(path="/data/xtc", pattern="*.xtc"))])

    :param path: local directory, or ``sftp://USER@HOST:PORT/DIR`` (paramiko; unknown host keys refused).
    :param pattern: glob on the relative path or the file name.
    :param recursive: descend into subdirectories.
    :param scope: seen-set name; default derived from path, pattern and recursive (watches of the same
        place share one memory; give distinct scopes to let two pipelines each see every file).
    :param min_files: wait until this many new complete files are available.
    :param max_files: at most this many files per batch (oldest first).
    :param poll_interval: seconds between looks (default 0.25 s local, 5 s for ``sftp://`` as Airflow's
        ``SFTPTrigger``: a remote listing is a round trip on someone else's host).
    :param min_age: files older than this many seconds count as complete on the first look.
    :param fstream_conn_id: the ``fstream`` connection (Redis holding the seen-set).
    :param ssh_key_file: private key for SFTP.
    :param known_hosts: known_hosts file for SFTP (default: the system's).
    :param identity: what "the same file" means: ``path`` (default: a file is reported once, whatever
        happens to it later — instruments write each file once, and a touched or re-copied file is not
        transferred twice) or ``path+size+mtime`` (a rewritten file is a new version, reported again).
    :param redeliver_after: seconds after its last delivery an unacknowledged batch is delivered again
        (default 300 s, Airflow's ``[triggerer] shared_stream_ack_timeout``).
    """

    def __init__(self, *, path: str, pattern: str = "*", recursive: bool = False, scope: str | None = None,
                 min_files: int = 1, max_files: int | None = None, poll_interval: float | None = None,
                 min_age: float = 0.0, fstream_conn_id: str = DEFAULT_CONN_ID, ssh_key_file: str | None = None,
                 known_hosts: str | None = None, identity: str = "path",
                 redeliver_after: float = DEFAULT_REDELIVER_AFTER_S) -> None:
        super().__init__()
        self.identity = identity
        self.redeliver_after = redeliver_after
        self.path = path
        self.pattern = pattern
        self.recursive = recursive
        self.scope = scope
        self.min_files = min_files
        self.max_files = max_files
        self.poll_interval = poll_interval
        self.min_age = min_age
        self.fstream_conn_id = fstream_conn_id
        self.ssh_key_file = ssh_key_file
        self.known_hosts = known_hosts

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "path": self.path,
                "pattern": self.pattern,
                "recursive": self.recursive,
                "scope": self.scope,
                "min_files": self.min_files,
                "max_files": self.max_files,
                "poll_interval": self.poll_interval,
                "min_age": self.min_age,
                "fstream_conn_id": self.fstream_conn_id,
                "ssh_key_file": self.ssh_key_file,
                "known_hosts": self.known_hosts,
                "identity": self.identity,
                "redeliver_after": self.redeliver_after,
            },
        )

    # -- asset watcher: Airflow 3.3 shared-stream ack mode -------------------------------------------
    def shared_stream_key(self) -> Hashable | None:
        """The same trigger (same settings) shares one poll loop; a deferred task's trigger runs alone.

        A deferred sensor's trigger runs :meth:`run` (the sensor's ``execute_complete`` acknowledges);
        two sensors with the same settings must each get their own batches, not the same one."""
        if self.task_instance is not None:
            return None
        return ("fstream.new_files", json.dumps(self.serialize()[1], sort_keys=True, default=str))

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> NewFilesProducer:
        """Opts into ack mode: the producer acknowledges a batch once Airflow stored its event."""
        return NewFilesProducer(cls(**kwargs))

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """Every batch is this trigger's event; keep consuming (moving past an event lets it be acknowledged)."""
        async for payload in shared_stream:
            yield TriggerEvent(payload)

    # -- standalone: a deferred sensor, dag.test() ---------------------------------------------------
    def effective_scope(self) -> str:
        return NewFilesWatch.scope_of(self)

    def effective_poll_interval(self) -> float:
        """``poll_interval`` if given, else 0.25 s for a local directory and 5 s for ``sftp://``."""
        return default_poll_interval(self.path, self.poll_interval)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """One batch, then return: a batch due for redelivery first, else the next batch of new files."""
        watch = NewFilesWatch(self)
        self.log.info("watching %s for %r (scope %s)", watch.location.url(), self.pattern, watch.scope)
        try:
            while True:
                payload = await watch.next_batch()
                if payload is not None:
                    self.log.info("%s (batch %s)", payload["message"], payload["batch_id"])
                    yield TriggerEvent(payload)
                    return
                await watch.sleep()
        finally:
            await watch.close()
