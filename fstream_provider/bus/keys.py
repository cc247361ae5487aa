"""The one Redis key schema of FStream: every key, its type, writers, readers and retention.

All keys share the prefix ``{<namespace>}:`` (default ``{fstream}:``). The braces are a Redis
Cluster hash tag: every FStream key lives in one hash slot, so the Lua scripts that update a
job, its events, the jobs stream and an idempotency key atomically also work on a Cluster
(FStream's Redis load is small; one slot is plenty). The same schema is in ``docs/redis-keys.md``.

======================  ===========  ==========================================================  ===================  =====================  ==========================================
key (method)            type         fields / members                                            written by           read by                retention
======================  ===========  ==========================================================  ===================  =====================  ==========================================
jobs_stream()           stream       ``job_id``                                                  JobStore.submit      agents (group agents)  trimmed (MINID) only below the oldest
                                                                                                                                             unacknowledged / undelivered entry
jobs_group()            group name   ``agents`` (consumer group on jobs_stream; consumer =       Agent                Agent                  with the stream
                                     agent name)
dead_letter()           stream       ``job_id``, ``stream_id``, ``deliveries``, ``reason``,      Agent                operators, status      MAXLEN ~ 10,000
                                     ``ts``
job(id)                 hash         job_id, state, attempt, deliveries, spec (JSON), worker,    JobStore, Agent      CLI, Airflow trigger,  no TTL while live; 7 days after a
                                     created_at, updated_at, error, result (JSON),               (fenced by attempt)  hook                   terminal state
                                     idempotency_key, cancel_requested,
                                     cancel_reason, stream_id, progress (JSON)
job_events(id)          stream       ``kind``, ``ts``, ``data`` (JSON); kinds: queued, claimed,  JobStore, Agent      CLI, Airflow trigger   MAXLEN ~ 100,000; 7 days after terminal
                                     interval, tuning, file, log, error, retry, cancel,
                                     released, requeued, done (always last)
job_index()             sorted set   job ids scored by created_at                                JobStore.submit      JobStore.list          entries older than 7 days dropped on
                                                                                                                                             submit
idempotency(key)        string       the job id                                                  JobStore.submit      JobStore.submit        7 days after the job's terminal state
agent(name)             hash         name, host, pid, started_at, seen, job_id, attempt          Agent heartbeat      reclaim, status        TTL = heartbeat_ttl (refreshed ttl/3)
agents()                set          agent names                                                 Agent                status, reclaim        members removed on clean stop
history()               stream       ``row``: JSON ``HistoryRow`` (tuning.harp_history): the     agents (intervals),  HARP optimizer,        MAXLEN ~ 1,000,000 and MINID ~ 90 days
                                     path, dataset chunk, cc/p/pp, throughput, time, group       fstream calibrate    fstream history        (TransferHistory limits, configurable)
calibration(path_id)    hash         ``run`` -> run id; ``pass|chunk|cc|p|pp`` -> the probe's    fstream calibrate    fstream calibrate      until ``--restart``
                                     throughput (the probes done on this path)
profiling(size, ftype)  list         JSON profiling records, newest first (LPUSH)                FStream tuner        FStream tuner          LTRIM to the newest 1,000
pool(src, dst)          hash         s_pmax, s_cmax, s_i, s_u, policy; grant:<client> ->         StreamPools          StreamPools,           fields of a lapsed lease dropped by the
                                     streams, lease:<client> -> expiry ms (Redis clock)          (agents)             fstream pools          next request or renewal
sched_tasks()           hash         job id -> JSON task: ends, size, class, arrival, state      agents (scheduler)   agents, fstream        field dropped when the job ends
                                     (waiting|running), agent, cc, run time, preempt_by/reason                        schedule
sched_progress()        hash         job id -> JSON {done, rate, ts} of a running task            running agent        agents (scheduler)     field dropped when the task stops
sched_config()          hash         cap:<endpoint>, unit:<endpoint>, unit_seen:<endpoint>        fstream schedule     agents (scheduler)     none
                                     (bits/s), ratio:<src>|<dst> (correction from recent          set, agents
                                     transfers)
seen(scope)             set          paths (or path|size|mtime) already reported                 new-files sensor /   sensor, trigger        until the sensor's scope is reset
                                                                                                 trigger
pending(scope)          hash         batch id -> JSON {claimed_at, delivered_at, files}          new-files trigger    trigger (ack mode),    until acknowledged or the scope is reset
                                                                                                                      sensor, any watcher
looks(scope)            string       JSON path -> [size, mtime, since], <= 10,000 files          new-files sensor     the next poke          TTL max(1 h, 10 x poke_interval)
audit()                 stream       ``kind`` (decision|outcome), ``job_id``, ``submitter``,      agents               fstream audit,         MAXLEN ~ 1,000,000 (append-only; agents
                                     ``decision`` (accepted|refused), ``reason``, ``sources``,                         operators              write, nobody else may: docs/redis-keys.md)
                                     ``destination``, ``key``, ``agent``, ``outcome``, ``ts``
nonce(sub, nonce)       string       ``<job id> <stream entry id>``: the first job that used     agents               agents                 TTL = the agents' max job age + clock skew
                                     this submitter's nonce (a replay names another)
cancel_channel(id)      pub/sub      message ``cancel``                                          JobStore.cancel      Agent (optional)       none (pub/sub)
======================  ===========  ==========================================================  ===================  =====================  ==========================================
"""

from __future__ import annotations

import re

_SAFE = re.compile(r"[^A-Za-z0-9._/@+=-]")

JOB_RETENTION_S = 7 * 24 * 3600
EVENTS_MAXLEN = 100_000
DEAD_LETTER_MAXLEN = 10_000
AUDIT_MAXLEN = 1_000_000
HISTORY_MAXLEN = 1_000_000
PROFILING_KEEP = 1_000


def _part(value: object) -> str:
    """A key component: anything outside a safe set (``:``, spaces, braces) is percent-escaped."""
    text = str(value)
    if not text:
        raise ValueError("Redis key component: must not be empty")
    return _SAFE.sub(lambda m: "".join("%%%02X" % b for b in m.group().encode()), text)


class Keys:
    """Builds every FStream Redis key; see the module docstring for types and retention.

    :param namespace: the prefix inside the hash tag; two namespaces on one Redis never
        see each other's jobs (tests and multi-tenant deployments use this).
    """

    def __init__(self, namespace: str = "fstream") -> None:
        if not namespace or "{" in namespace or "}" in namespace:
            raise ValueError(f"namespace {namespace!r}: must be non-empty and without braces")
        self.namespace = namespace
        self.prefix = "{" + namespace + "}:"

    def __repr__(self) -> str:
        return f"Keys(namespace={self.namespace!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keys) and other.namespace == self.namespace

    def __hash__(self) -> int:
        return hash(self.namespace)

    # jobs
    def jobs_stream(self) -> str:
        return self.prefix + "jobs"

    def jobs_group(self) -> str:
        return "agents"

    def dead_letter(self) -> str:
        return self.prefix + "jobs:dead"

    def job(self, job_id: str) -> str:
        return self.prefix + "job:" + _part(job_id)

    def job_events(self, job_id: str) -> str:
        return self.prefix + "job:" + _part(job_id) + ":events"

    def job_index(self) -> str:
        return self.prefix + "jobs:index"

    def idempotency(self, key: str) -> str:
        return self.prefix + "idem:" + _part(key)

    def cancel_channel(self, job_id: str) -> str:
        return self.prefix + "job:" + _part(job_id) + ":cancel"

    # authorization (issue 32)
    def audit(self) -> str:
        """Append-only record of every job's submitter, sources, destination, decision and outcome."""
        return self.prefix + "audit"

    def nonce(self, submitter: str, nonce: str) -> str:
        """The first use of a submitter's job nonce (replay guard)."""
        return self.prefix + "nonce:" + _part(submitter) + ":" + _part(nonce)

    # agents
    def agent(self, name: str) -> str:
        return self.prefix + "agent:" + _part(name)

    def agents(self) -> str:
        return self.prefix + "agents"

    # tuning state
    def history(self) -> str:
        return self.prefix + "history"

    def calibration(self, path_id: str) -> str:
        """``fstream calibrate``'s progress on one path (the probes done), so a second run continues."""
        return self.prefix + "calibration:" + _part(path_id)

    def profiling(self, size_class: str, ftype: str) -> str:
        return self.prefix + "profiling:" + _part(size_class) + ":" + _part(ftype)

    def pool(self, src: str, dst: str) -> str:
        return self.prefix + "pool:" + _part(src) + ":" + _part(dst)

    # sensors
    # -- the agents' shared scheduler (SEAL/STEAL, issue #11)
    def sched_tasks(self) -> str:
        return self.prefix + "sched:tasks"

    def sched_progress(self) -> str:
        return self.prefix + "sched:progress"

    def sched_config(self) -> str:
        return self.prefix + "sched:config"

    def seen(self, scope: str) -> str:
        return self.prefix + "seen:" + _part(scope)

    def pending(self, scope: str) -> str:
        """Batches a new-files trigger claimed and handed to Airflow, not yet known to be delivered."""
        return self.prefix + "pending:" + _part(scope)

    def looks(self, scope: str) -> str:
        """The last look at a scope's not-yet-complete files (a rescheduled sensor's stability memory)."""
        return self.prefix + "looks:" + _part(scope)
