"""The one Redis key schema of FStream: every key, its slot, type, writers, readers and retention.

Two kinds of keys (``docs/redis-keys.md`` has the same table and the reasons):

- the **namespace slot**: the job control plane starts with ``{<namespace>}:`` (default ``{fstream}:``).
  The braces are a Redis Cluster hash tag, so these keys share one slot: the Lua scripts that change a
  job, its events, the jobs stream, the dead letters and an idempotency key atomically
  (``bus.job_scripts``), and the scheduler board's WATCH/MULTI over its hashes and the jobs stream
  (``bus.sched_board``), run on a Cluster too. The agents' heartbeats, the audit stream and the nonces
  stay there with them (small, and written next to job state).
- **tenants** (issue 40): a job id is ``<submitter>:<hex>`` and an idempotency key or new-files scope of a submitter
  is ``<submitter>:<name>`` (``owned(owner, name)``), so each submitter's keys start with ``<submitter>%3A`` once
  escaped and its Redis user gets those alone (``owner_patterns(owner)``, ``bus.acl``); ``owner_of(name)`` and
  ``unowned(name)`` read the prefix back.
- **own slots**: the bulky, independent data has a hash tag of its own, ``{<ns>:<family>[:<id>]}``, so a
  Cluster spreads it over its masters: one tag per new-files scope for ``seen``, ``pending`` and ``looks``
  (``{fstream:watch:<scope>}:seen``: one Lua call claims in ``seen`` and records in ``pending``), and the
  whole key as its tag for ``history()``, each ``calibration(path)``, each ``profiling(size, type)`` list
  and each ``pool(src, dst)``. ``<ns>`` is the namespace escaped like a key component.
  ``own_slot_patterns()`` gives their glob patterns (ACL rules, SCAN; ``pool_pair(key)`` reads a pool key
  back); ``legacy_patterns()`` and
  ``renamed(old)`` map the keys of FStream before this layout (``{ns}:seen:<scope>``, ...) to these
  (``fstream redis migrate-keys``, ``bus.migrate_keys``), and ``migration_temp(key)`` is the scratch key
  that migration rebuilds a stream in (same slot as ``key``).

======================  ======================  ===========  ==========================================================  ===================  =====================  ==========================================
key (method)            slot (hash tag)         type         fields / members                                            written by           read by                retention
======================  ======================  ===========  ==========================================================  ===================  =====================  ==========================================
jobs_stream()           {ns}                    stream       ``job_id``                                                  JobStore.submit      agents (group agents)  trimmed (MINID) only below the oldest
                                                                                                                                                                     unacknowledged / undelivered entry
jobs_group()            {ns}                    group name   ``agents`` (consumer group on jobs_stream; consumer =       Agent                Agent                  with the stream
                                                             agent name)
dead_letter()           {ns}                    stream       ``job_id``, ``stream_id``, ``deliveries``, ``reason``,      Agent                operators, status      MAXLEN ~ 10,000
                                                             ``ts``
job(id)                 {ns}                    hash         job_id, state, attempt, deliveries, spec (JSON), worker,    JobStore, Agent      CLI, Airflow trigger,  no TTL while live; 7 days after a
                                                             created_at, updated_at, error, result (JSON),               (fenced by attempt)  hook                   terminal state
                                                             idempotency_key, cancel_requested,
                                                             cancel_reason, stream_id, progress (JSON)
job_events(id)          {ns}                    stream       ``kind``, ``ts``, ``data`` (JSON); kinds: queued, claimed,  JobStore, Agent      CLI, Airflow trigger   MAXLEN ~ 100,000; 7 days after terminal
                                                             interval, tuning, file, log, error, retry, cancel,
                                                             released, requeued, done (always last)
job_followed(id)        {ns}                    hash         per deferred task try (``dag/run/task/map#try``): the last  Airflow trigger      Airflow trigger (a     7 days after its last write
                                                             event id its trigger logged                                                       triggerer taking over)
job_index()             {ns}                    sorted set   job ids an agent claimed, scored by created_at              Agent (claim)        JobStore.list, status  entries older than 7 days dropped on
                                                                                                                                                                     claim
job_index_of(owner)     {ns}                    sorted set   one submitter's job ids from submission, by created_at      JobStore.submit      its submitter's list   7 days after its newest job; older
                                                             (its ACL user may write no other index; issue 40)                                                       entries dropped on submit
job_owners()            {ns}                    set          submitter ids the agents serve (whose indexes viewers       Agent heartbeat,     JobStore.list (agent,  none (one member per submitter)
                                                             read); a submitter's store adds itself when it may          JobStore.submit      viewer)
idempotency(key)        {ns}                    string       the job id; key = ``<submitter>:<key as given>``            JobStore.submit      JobStore.submit        7 days after the job's terminal state
agent(name)             {ns}                    hash         name, host, pid, started_at, seen, job_id, attempt          Agent heartbeat      reclaim, status        TTL = heartbeat_ttl (refreshed ttl/3)
agents()                {ns}                    set          agent names                                                 Agent                status, reclaim        members removed on clean stop
history()               {ns:history}            stream       ``row``: JSON ``HistoryRow`` (tuning.harp_history): the     agents (intervals),  HARP optimizer,        MAXLEN ~ 1,000,000 and MINID ~ 90 days
                                                             path, dataset chunk, cc/p/pp, throughput, time, group       fstream calibrate    fstream history        (TransferHistory limits, configurable)
calibration(path_id)    {ns:calibration:<p>}    hash         ``run`` -> run id; ``pass|chunk|cc|p|pp`` -> the probe's    fstream calibrate    fstream calibrate      until ``--restart``
                                                             throughput (the probes done on this path)
profiling(size, ftype)  {ns:profiling:<s>:<t>}  list         JSON profiling records, newest first (LPUSH)                FStream tuner        FStream tuner          LTRIM to the newest 1,000
pool(src, dst)          {ns:pool:<src>:<dst>}   hash         s_pmax, s_cmax, s_i, s_u, policy; grant:<client> ->         StreamPools          StreamPools,           fields of a lapsed lease dropped by the
                                                             streams, lease:<client> -> expiry ms (Redis clock)          (agents)             fstream pools          next request or renewal
sched_tasks()           {ns}                    hash         job id -> JSON task: ends, size, class, arrival, state      agents (scheduler)   agents, fstream        field dropped when the job ends
                                                             (waiting|running), agent, cc, run time, preempt_by/reason                        schedule
sched_progress()        {ns}                    hash         job id -> JSON {done, rate, ts} of a running task            running agent        agents (scheduler)     field dropped when the task stops
sched_config()          {ns}                    hash         cap:<endpoint>, unit:<endpoint>, unit_seen:<endpoint>        fstream schedule     agents (scheduler)     none
                                                             (bits/s), ratio:<src>|<dst> (correction from recent          set, agents
                                                             transfers)
sched_version()         {ns}                    sorted set   ``#`` -> the board's version, ``#t`` -> the version of the  agents (in each      agents (scheduler)     the last 2,048 versions (never below
                                                             tasks' last change, ``t:``/``p:`` + job id -> the version   board write's MULTI)                        ``#t``)
                                                             its task / progress last changed at
sched_turn()            {ns}                    string       the agent whose scheduling cycle this is (SET NX PX:         agents               agents                 PX = half the cycle interval; dropped
                                                             one full cycle per half interval, facility-wide)                                                   by a cycle that started a job
seen(scope)             {ns:watch:<scope>}      set          paths (or path|size|mtime) already reported                 new-files sensor /   sensor, trigger        until the sensor's scope is reset
                                                                                                                         trigger
pending(scope)          {ns:watch:<scope>}      hash         batch id -> JSON {claimed_at, delivered_at, files}          new-files trigger    trigger (ack mode),    until acknowledged or the scope is reset
                                                                                                                                              sensor, any watcher
looks(scope)            {ns:watch:<scope>}      string       JSON path -> [size, mtime, since], <= 10,000 files          new-files sensor     the next poke          TTL max(1 h, 10 x poke_interval)
audit()                 {ns}                    stream       ``kind`` (decision|outcome), ``job_id``, ``submitter``,      agents               fstream audit,         MAXLEN ~ 1,000,000 (append-only; agents
                                                             ``decision`` (accepted|refused), ``reason``, ``sources``,                         operators              write, nobody else may: docs/redis-keys.md)
                                                             ``destination``, ``key``, ``agent``, ``outcome``, ``ts``
nonce(sub, nonce)       {ns}                    string       ``<job id> <stream entry id>``: the first job that used     agents               agents                 TTL = the agents' max job age + clock skew
                                                             this submitter's nonce (a replay names another)
cancel_channel(id)      {ns}                    pub/sub      message ``cancel``                                          JobStore.cancel      Agent (optional)       none (pub/sub)
======================  ======================  ===========  ==========================================================  ===================  =====================  ==========================================

"7 days" below is the default job retention; ``--job-retention`` (``JobStore(retention_s=)``) sets it, and
``fstream gc`` (``bus.retention``) reclaims what a crash or an older version left without a TTL.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_SAFE = re.compile(r"[^A-Za-z0-9._/@+=-]")
_OWNER = re.compile(r"[A-Za-z0-9._@-]{1,64}")  # a submitter id (``authz.signing.SUBMITTER_ID``)

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
    """Builds every FStream Redis key; see the module docstring for slots, types and retention.

    :param namespace: the prefix inside the hash tag; two namespaces on one Redis never
        see each other's jobs (tests and multi-tenant deployments use this).
    """

    def __init__(self, namespace: str = "fstream") -> None:
        if not namespace or "{" in namespace or "}" in namespace:
            raise ValueError(f"namespace {namespace!r}: must be non-empty and without braces")
        self.namespace = namespace
        self.prefix = "{" + namespace + "}:"  # the namespace slot
        # the namespace inside an own tag, escaped like a component: no ':' (another namespace's own tag cannot
        # read as this one's), no glob character (an ACL pattern or SCAN match built from it stays literal)
        self._own_ns = _part(namespace)

    def __repr__(self) -> str:
        return f"Keys(namespace={self.namespace!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keys) and other.namespace == self.namespace

    def __hash__(self) -> int:
        return hash(self.namespace)

    def _own(self, *parts: str) -> str:
        """A hash tag of its own: ``{<ns>:<part>:<part>...}`` (parts already escaped, or a glob ``*``)."""
        return "{" + ":".join((self._own_ns, *parts)) + "}"

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

    def job_followed(self, job_id: str) -> str:
        """A hash: how far each deferred task's trigger has logged the job's events (``FStreamTransferTrigger``)."""
        return self.prefix + "job:" + _part(job_id) + ":followed"

    def job_index(self) -> str:
        """Every claimed job (written by agents only, at claim; issue 40): the facility's list."""
        return self.prefix + "jobs:index"

    def job_index_of(self, owner: str) -> str:
        """One submitter's own jobs from submission on (its SUBMIT writes it; nobody else's user can)."""
        return self.prefix + "jobs:index:" + _part(owner)

    def job_owners(self) -> str:
        """The submitter ids agents serve (their policies'; agents alone write it): whose own indexes a viewer's or
        an agent's ``JobStore.list`` reads besides the facility's."""
        return self.prefix + "jobs:owners"

    # tenants (issue 40): what a submitter may write carries its id as the first ':'-separated part of the job id,
    # the idempotency key and the new-files scope; a submitter id holds no ':' or '%', so the escaped prefix
    # ``<owner>%3A`` is one submitter's and an ACL pattern ``...:<owner>%3A*`` gives that submitter exactly its own
    @staticmethod
    def owned(owner: str, name: str) -> str:
        """``<owner>:<name>``: a job id, idempotency key or new-files scope that belongs to submitter ``owner``."""
        if not isinstance(owner, str) or not _OWNER.fullmatch(owner):
            raise ValueError(f"owner {owner!r}: not a submitter id (1-64 letters, digits, '.', '_', '@' or '-')")
        return f"{owner}:{name}"

    @staticmethod
    def owner_of(name: str | None) -> str | None:
        """The submitter a job id / idempotency key / scope belongs to (``owned``), or None (made before issue 40,
        or unsigned: only agents may write those)."""
        owner, sep, rest = (name or "").partition(":")
        return owner if sep and rest and _OWNER.fullmatch(owner) else None

    @staticmethod
    def unowned(name: str | None) -> str | None:
        """``name`` without its owner prefix (what the submitter gave), unchanged when it has none."""
        return name.partition(":")[2] if Keys.owner_of(name) else name

    def owner_patterns(self, owner: str) -> dict[str, str]:
        """Glob pattern of each key family submitter ``owner`` owns (ACL rules): its jobs (hash, events, followed,
        cancel channel), idempotency keys, index, and its new-files scopes' own slots."""
        lit = _glob_literal
        tagged = lit(_part(self.owned(owner, "x"))[:-1])  # '<owner>%3A'
        p = lit(self.prefix)
        watch = "{" + lit(self._own_ns) + ":watch:" + tagged + "*}"
        return {"job": p + "job:" + tagged + "*", "idem": p + "idem:" + tagged + "*",
                "index": lit(self.job_index_of(owner)), "cancel": p + "job:" + tagged + "*:cancel",
                "seen": watch + ":seen", "pending": watch + ":pending", "looks": watch + ":looks"}

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

    # -- the agents' shared scheduler (SEAL/STEAL, issue #11)
    def sched_tasks(self) -> str:
        return self.prefix + "sched:tasks"

    def sched_version(self) -> str:
        """The board's change log (issue 28): its version and what changed at which version (``bus.sched_view``)."""
        return self.prefix + "sched:version"

    def sched_turn(self) -> str:
        """Whose scheduling cycle it is (issue 28): one idle agent cycles per half interval, not every agent."""
        return self.prefix + "sched:turn"

    def sched_progress(self) -> str:
        return self.prefix + "sched:progress"

    def sched_config(self) -> str:
        return self.prefix + "sched:config"

    # tuning state: each key its own slot (issue 28)
    def history(self) -> str:
        return self._own("history")

    def calibration(self, path_id: str) -> str:
        """``fstream calibrate``'s progress on one path (the probes done), so a second run continues."""
        return self._own("calibration", _part(path_id))

    def profiling(self, size_class: str, ftype: str) -> str:
        return self._own("profiling", _part(size_class), _part(ftype))

    def pool(self, src: str, dst: str) -> str:
        return self._own("pool", _part(src), _part(dst))

    def pool_pair(self, key: str) -> tuple[str, str] | None:
        """The (source, destination) of a ``pool()`` key of this namespace (unescaped), else None."""
        head = "{" + self._own_ns + ":pool:"
        if not (key.startswith(head) and key.endswith("}")):
            return None
        src, sep, dst = key[len(head):-1].partition(":")
        return (unquote(src), unquote(dst)) if sep and src and dst else None

    # new-files sensors and triggers: one slot per scope (the claim script writes seen and pending together)
    def seen(self, scope: str) -> str:
        return self._own("watch", _part(scope)) + ":seen"

    def pending(self, scope: str) -> str:
        """Batches a new-files trigger claimed and handed to Airflow, not yet known to be delivered."""
        return self._own("watch", _part(scope)) + ":pending"

    def looks(self, scope: str) -> str:
        """The last look at a scope's not-yet-complete files (a rescheduled sensor's stability memory)."""
        return self._own("watch", _part(scope)) + ":looks"

    # the layout: patterns, and the way from the keys before it
    def own_slot_patterns(self) -> dict[str, str]:
        """Glob pattern of each key family outside the namespace slot (for ACL rules and ``SCAN MATCH``).

        Literal but for ``*`` (the namespace is escaped), and no other namespace's key matches them.
        """
        return {"seen": self._own("watch", "*") + ":seen", "pending": self._own("watch", "*") + ":pending",
                "looks": self._own("watch", "*") + ":looks", "history": self._own("history"),
                "history-migrating": self.migration_temp(self.history()),
                "calibration": self._own("calibration", "*"), "profiling": self._own("profiling", "*"),
                "pool": self._own("pool", "*")}

    def legacy_patterns(self) -> dict[str, str]:
        """``SCAN MATCH`` pattern of each family's keys as FStream named them before they had their own slots
        (``{ns}:seen:<scope>``, ``{ns}:history``, ...): what ``renamed`` takes."""
        p = _glob_escape(self.prefix)
        return {family: p + family + ("" if family == "history" else ":*") for family in _LEGACY}

    def renamed(self, old: str) -> tuple[str, str] | None:
        """``(family, new key)`` for a key of the layout before issue 28 (``{ns}:seen:<scope>`` ->
        ``{ns:watch:<scope>}:seen``, ``{ns}:pool:<src>:<dst>`` -> ``{ns:pool:<src>:<dst>}``), else None."""
        if not old.startswith(self.prefix):
            return None
        family, _, rest = old[len(self.prefix):].partition(":")
        if family not in _LEGACY or (family == "history") != (rest == ""):
            return None
        parts = rest.split(":") if rest else []
        if any(not part or _SAFE.search(part.replace("%", "")) for part in parts) or len(parts) != _LEGACY[family]:
            return None
        if family in ("seen", "pending", "looks"):
            return family, self._own("watch", *parts) + ":" + family
        return family, self._own(family, *parts)

    def migration_temp(self, key: str) -> str:
        """Where ``fstream redis migrate-keys`` rebuilds ``key`` before renaming it into place (same slot)."""
        if not key.startswith("{") or "}" not in key:
            raise ValueError(f"Redis key {key!r}: not a hash-tagged FStream key")
        return key + ":migrating"


# the families that moved to their own slots (issue 28) -> the number of components after the family name
_LEGACY = {"seen": 1, "pending": 1, "looks": 1, "history": 0, "calibration": 1, "profiling": 2, "pool": 2}


def _glob_literal(text: str) -> str:
    """``text`` as a literal Redis glob: its ``*?[]\\`` escaped (braces are literal to Redis: kept as written, as the
    ACL rules of ``bus.acl`` write the namespace slot)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _glob_escape(text: str) -> str:
    """``text`` as a literal Redis glob (``SCAN MATCH``, ACL key patterns)."""
    return re.sub(r"([*?\[\]\\{}])", r"\\\1", text)
