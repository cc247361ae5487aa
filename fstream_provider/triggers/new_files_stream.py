"""The new-files watch as an Airflow 3.3 shared-stream producer: a batch is acknowledged once Airflow stored its event.

Airflow 3.3's triggerer runs a ``BaseEventTrigger`` that overrides ``create_shared_stream_producer`` in
*ack mode* (:mod:`airflow.triggers.shared_stream`): one poll loop per key (:meth:`NewFilesProducer.open_stream`)
yields ``(raw_event, broker_payload)``; the trigger's ``filter_shared_stream`` turns each raw event into a
``TriggerEvent``; and once the subscriber moved past the event **and the supervisor confirmed the
trigger event persisted in the metadata database**, the manager calls :meth:`NewFilesProducer.advance`.
That is the hook after persistence the plain ``run()`` path lacks, and it is where a batch is
acknowledged (removed from ``pending(scope)``). A batch whose event was not stored (ack timeout,
persist failure, no subscriber online) is released and delivered again; a batch left behind by a
triggerer that died is taken again after ``redeliver_after`` by whichever watcher of the scope polls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer
from redis.exceptions import RedisError

from fstream_provider.hooks.fstream_async import FStreamAsyncHook
from fstream_provider.hooks.sftp import Scanner
from fstream_provider.watch.location import Location, default_scope
from fstream_provider.watch.pending import PendingBatches, normalize_identity
from fstream_provider.watch.watcher import Watcher, batch_payload

WARN_EVERY_S = 60.0  # a missing directory or a Redis outage is logged once a minute, not every poll


class NewFilesWatch:
    """What one poll loop over a scope needs: scanner, async hook, pending store and watcher (opened lazily).

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
            self.store = PendingBatches(client, keys.seen(self.scope), keys.pending(self.scope), self.t.identity)
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
        """Acknowledge the batches whose events Airflow stored; release the others for redelivery."""
        assert self.watch is not None and self.watch.store is not None
        for item in batch:
            batch_id, outcome = item.broker_payload, item.outcome
            if outcome.acked > 0:  # some subscriber's event for it is stored: delivered
                await self.watch.store.ack(batch_id)
            else:  # not stored, or nobody was listening: deliver it again
                self.trigger.log.warning("batch %s was not stored by Airflow (%s): releasing it for re-delivery",
                                         batch_id, outcome)
                await self.watch.store.release(batch_id)
            self.inflight.discard(batch_id)

    async def aclose(self) -> None:
        if self.watch is not None:
            await self.watch.close()
