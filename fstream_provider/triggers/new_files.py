"""``FStreamNewFilesTrigger``: fire once per batch of new, complete files (local or SFTP); drives an ``AssetWatcher``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from redis.exceptions import RedisError

from fstream_provider.hooks.fstream import DEFAULT_CONN_ID
from fstream_provider.hooks.sftp import Scanner
from fstream_provider.watch.location import Location, default_poll_interval, default_scope
from fstream_provider.watch.pending import YIELDED, PendingBatches
from fstream_provider.watch.watcher import Watcher, batch_payload


class FStreamNewFilesTrigger(BaseEventTrigger):
    """Yield one event ``{"status", "message", "files", "details", "bytes", "scope", "location"}`` per batch.

    Files count once they are complete (size and mtime unchanged between two looks ``poll_interval``
    apart, or older than ``min_age``) and not yet in the scope's Redis seen-set. The batch is claimed
    in that set (``SADD``) right before the event, so a file is claimed once across restarts,
    duplicate triggers (two triggerers, two assets watching the same place) and the re-run an
    ``AssetWatcher`` does after every event: the fix for apache/airflow issue 49900 lives in Redis,
    not in the trigger's memory. The same Lua call records the batch as *pending*
    (:mod:`fstream_provider.watch.pending`): the next run in this triggerer process acknowledges it,
    and a batch whose process died before that is yielded again with the same ``batch_id`` after
    ``redeliver_after`` — at-least-once delivery with a stable batch id, where it used to be
    at-most-once. The trigger yields one event and returns, like Airflow's own event triggers; the
    triggerer starts it again for the next batch.

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
    :param poll_interval: seconds between looks (default 0.25 s local, 5 s for ``sftp://``).
    :param min_age: files older than this many seconds count as complete on the first look.
    :param fstream_conn_id: the ``fstream`` connection (Redis holding the seen-set).
    :param ssh_key_file: private key for SFTP.
    :param known_hosts: known_hosts file for SFTP (default: the system's).
    :param identity: what "the same file" means: ``path`` (default; a file is reported once, as instruments
        that write each file once expect) or ``version`` (path + size + mtime: a rewritten file is new).
    :param redeliver_after: seconds a pending batch no trigger of this process yielded waits before it
        is yielded again (its triggerer died between the claim and Airflow's next run).
    """

    def __init__(self, *, path: str, pattern: str = "*", recursive: bool = False, scope: str | None = None,
                 min_files: int = 1, max_files: int | None = None, poll_interval: float | None = None,
                 min_age: float = 0.0, fstream_conn_id: str = DEFAULT_CONN_ID, ssh_key_file: str | None = None,
                 known_hosts: str | None = None, identity: str = "path", redeliver_after: float = 60.0) -> None:
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

    def effective_scope(self) -> str:
        return self.scope or default_scope(self.path, self.pattern, self.recursive)

    async def _settle_pending(self, store: PendingBatches) -> tuple[str, list] | None:
        """Acknowledge the batches this process yielded; return one to yield again, if a dead process left it."""
        for bid, claimed_at, files in await store.pending():
            if bid in YIELDED:
                await store.ack(bid)  # Airflow took our event and ran this trigger again: delivered
            elif time.time() - claimed_at >= self.redeliver_after:
                return bid, files
        return None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from fstream_provider.hooks.fstream_async import FStreamAsyncHook

        location = Location.parse(self.path)
        scope = self.effective_scope()
        scanner = Scanner(location, pattern=self.pattern, recursive=self.recursive, key_file=self.ssh_key_file,
                          known_hosts=self.known_hosts)
        hook = FStreamAsyncHook(fstream_conn_id=self.fstream_conn_id)
        last_warning = 0.0
        try:
            client, keys = await hook.get_client(), await hook.get_keys()
            store = PendingBatches(client, keys.seen(scope), keys.pending(scope), self.identity)
            watcher = Watcher(scanner, store=store, min_age=self.min_age)
            self.log.info("watching %s for %r (scope %s, seen-set %s)", location.url(), self.pattern, scope,
                          store.seen_key)
            while True:
                try:
                    again = await self._settle_pending(store)
                    if again is not None:
                        bid, files = again
                        payload = dict(batch_payload(files, scope=scope, location=location.url()), batch_id=bid,
                                       redelivered=True)
                        self.log.warning("re-delivering batch %s (%d file(s)): the triggerer that claimed it "
                                         "stopped before Airflow ran this trigger again", bid, len(files))
                        YIELDED.add(bid)
                        yield TriggerEvent(payload)
                        return
                    won = await watcher.apoll(self.min_files, self.max_files)  # lists in a thread: I/O blocks
                    if won:
                        payload = dict(batch_payload(won, scope=scope, location=location.url()),
                                       batch_id=store.last_batch_id)
                        self.log.info("%s (batch %s)", payload["message"], store.last_batch_id)
                        YIELDED.add(store.last_batch_id)
                        yield TriggerEvent(payload)
                        return
                except (OSError, EOFError, RedisError) as exc:  # missing directory, SFTP or Redis hiccup: keep watching
                    if time.monotonic() - last_warning > 60:
                        self.log.warning("watching %s: %s (will keep retrying)", location.url(), exc)
                        last_warning = time.monotonic()
                await asyncio.sleep(default_poll_interval(self.path, self.poll_interval))
        finally:
            await asyncio.to_thread(scanner.close)
            await hook.close()
