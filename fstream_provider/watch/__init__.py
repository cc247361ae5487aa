"""The one file watcher, Airflow-free: lists files (local or polled remote), keeps the stable ones, remembers what was seen.

- ``stability``: ``FileStat`` and the one stability rule (``StabilityTracker``).
- ``listing``: the lister protocol, full local listing, the polling backend for SFTP (``RemoteDir``).
- ``tree``: the incremental, inotify-assisted local backend over files, directories and globs.
- ``seen``: seen/claim stores (Redis under the bus key schema; in memory).
- ``watcher``: ``Watcher`` (list, drop seen, keep stable, claim) and ``watch_path`` for channels.
- ``location``: where a sensor or trigger looks, and its default seen-set scope.
- ``sources``: the agent's ``SrcFile`` and rsync-style placement; ``source_watcher``: its ``--watch``.
"""
