"""The ``harp`` tuner: HARP's Scheduler (Arslan & Kosar, SC'16, §III-A, Algorithm 1) over FStream's sender.

What it does, in the paper's order:

1. **Partition** (line 3): every file goes to a chunk, *tiny*, *small*, *medium* or *large*, relative to
   the path's BDP (``harp_history.chunk_of``).
2. **Sample transfers** (lines 4–8): per chunk, the first files up to ``2 x bandwidth-seconds`` (the paper's
   ``2 * Bandwidth(MB)``, scaled by ``sample_scale``; at least ``min_sample_files`` files) form the chunk's
   sample, moved with the heuristic's settings for those files (``findParamsViaHeuristic``), one chunk
   after the other. The sample files are real files of the dataset: no byte is sent twice. Their
   throughput is measured from the per-cluster byte counts of the observations (the tuner asks its driver
   to observe every ``observe_every_s`` while sampling).
3. **Optimizer** (lines 11–16, ``harp_model``): while a chunk's sample is in flight, its sample-independent
   part runs (similar entries, groups, cubic fits, maxima, relaxation); when the sample ends, the
   sample-dependent part (errors at the sample's settings, DBSCAN classes, weighted average) gives
   (cc, p, pp) and the unit throughput. This is the paper's pipelined cost analysis: the regression work
   overlaps the sample transfers, and the transfer itself never stops (the driver keeps moving the
   sample while ``update`` computes).
   *Departure* (switch ``sample-pays``, ``harp_sample_cost``): every chunk first runs at its heuristic, nothing
   held, while the history loads and its groups are fitted; then its sample is skipped or cut when it cannot pay
   for itself (no model, one group, groups that agree on the path, or a cost above half the expected gain). A
   chunk without a sample starts from the equal-weight prediction; the sample's files not yet sent move with
   the chunk's settings.
4. **Channel allocation** (lines 17–23, ``harp_model.allocate_channels``), then every chunk starts with its
   settings, and they are kept (HARP tunes once; ``fstream`` is the tuner that keeps adapting).

The rest of each chunk is *held* (``Suggestion.held``) until the allocation: the paper starts the chunks
only after every sample (line 23 needs every chunk's unit throughput). Without usable history (none, or
no group that fits) a chunk falls back to the heuristic and the reason says why; without any history at
all no sample is taken. Files that arrive later (``--watch``) join their chunk's settings; a chunk first
seen later is predicted without a sample (equal group weights).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fstream_provider.tuning.base import ClusterLayout, FileInfo, Observation, PathInfo, Suggestion
from fstream_provider.tuning.common import fit_cc, fmt_bps, fmt_size
from fstream_provider.tuning.harp_history import CHUNKS, chunk_of
from fstream_provider.tuning.heuristic import Settings, clamp, heuristic

SAMPLE = ".sample"  # cluster-name suffix of a chunk's sample files
MIN_SAMPLE_SECONDS = 0.25  # sample-pays: a sample shorter than this many bandwidth-seconds measures no rate


def optimizer_for(path: PathInfo, variant: Any = None, fit_cache: Any = None) -> Any:
    """The paper's Optimizer within the path's bounds, with ``variant``'s departures (None: the default's) and
    ``fit_cache`` (``harp_fits.GroupFitCache``, or None); imports numpy and pandas: call it when first needed."""
    from fstream_provider.tuning.harp_model import HarpOptimizer

    return HarpOptimizer(max_cc=path.max_cc, max_p=min(32, path.max_p), max_pp=min(32, path.max_pp), variant=variant,
                         fit_cache=fit_cache)


def fit_cache_of(history: Any) -> Any:
    """The fitted-group cache a history source offers (its ``fit_cache``; a plain DataFrame offers none)."""
    cache = getattr(history, "fit_cache", None)
    return cache if hasattr(cache, "get_or_fit") else None


def request_for(path: PathInfo, chunk: str, avg_file_size: float, file_count: int, source: str = "",
                destination: str = "") -> Any:
    """The Optimizer's request for one chunk of files on ``path``."""
    from fstream_provider.tuning.harp_similarity import HarpRequest

    return HarpRequest(bandwidth_bps=path.bandwidth_bps, rtt_s=path.rtt_s, tcp_buffer=path.tcp_buffer, chunk=chunk,
                       avg_file_size=avg_file_size, file_count=file_count, source=source, destination=destination)


def history_rows(history: Any) -> int:
    """Rows a history (DataFrame, or a loading source with ``rows``) holds or will hold."""
    if history is None:
        return 0
    rows = getattr(history, "rows", None)
    return int(rows) if rows is not None and not callable(rows) else len(history)


@dataclass
class _Chunk:
    """One chunk's files, sample and decision."""

    name: str
    files: int = 0
    bytes: int = 0
    sample_files: int = 0
    sample_bytes: int = 0
    sample_closed: bool = False
    sample_settings: Settings | None = None
    sample_start: float | None = None
    sample_moved: int = 0
    sample_bps: float | None = None
    sample_goal: float | None = None  # bytes at which the sample ends (None: all its files; 0: no sample)
    planned: bool = False  # sample-pays has decided this chunk's sample
    fitted: Any = None
    prediction: Any = None
    settings: Settings | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def sampling(self) -> bool:
        return self.sample_start is not None and self.sample_bps is None and not self.skipped

    @property
    def skipped(self) -> bool:
        """No sample (``sample-pays``): the chunk is predicted without one."""
        return self.sample_goal == 0

    @property
    def rest_bytes(self) -> int:
        """Bytes still to move with the chunk's own settings: all but what its sample moved (Algorithm 1's chunk
        size; sample files moved at the heuristic before the sample started count as the chunk's)."""
        if self.skipped or not self.sample_files:
            return self.bytes
        return self.bytes - min(self.sample_bytes, self.sample_moved if self.sample_bps is not None else
                                self.sample_bytes)


class HarpTuner:
    """HARP's Scheduler as a ``Tuner``; the Optimizer is ``harp_model.HarpOptimizer``.

    :param path: the path description (bandwidth, RTT, TCP buffer and bounds).
    :param history: the transfer history (``harp_history.COLUMNS`` DataFrame), or a source that is still
        loading it: a callable returning the DataFrame or None while not ready, with ``rows`` (how many
        rows it will hold) and ``ready``. The sample starts at once; fitting waits for the history.
        None or empty: no history.
    :param optimizer: a ``HarpOptimizer`` (default one with the paper's settings).
    :param sample_scale: the sample is ``2 x bandwidth-seconds x sample_scale`` bytes per chunk.
    :param min_sample_files: at least this many files per sample (the paper: two).
    :param source: this side's name, for the similarity's path features.
    :param destination: the receiver's ``host:port``.
    :param observe_every_s: how often the driver should observe while a sample runs.
    :param clock: seconds counter for timing the optimizer (injected in tests).
    :param variant: HARP's departures from the paper that are on (``variants.HarpVariant``; None: all).
    """

    name = "harp"

    def __init__(self, *, path: PathInfo, history: Any = None, optimizer: Any = None, sample_scale: float = 1.0,
                 min_sample_files: int = 2, source: str = "", destination: str = "",
                 observe_every_s: float = 0.25, clock: Callable[[], float] = time.perf_counter,
                 variant: Any = None) -> None:
        if sample_scale <= 0 or min_sample_files < 1:
            raise ValueError(f"harp: sample_scale ({sample_scale}) must be > 0 and min_sample_files "
                             f"({min_sample_files}) >= 1")
        self.path = path
        self._source = history
        self._optimizer = optimizer  # built on first use: numpy and pandas take half a second to import
        self.variant = variant
        named = variant is not None and variant.name != "default"
        self._tag = f"harp ({variant.name})" if named else "harp"  # the variant reaches every reason
        self.has_history = history_rows(history) > 0
        self.sample_target = 2.0 * path.bandwidth_bps / 8.0 * sample_scale
        self.min_sample_bytes = MIN_SAMPLE_SECONDS * path.bandwidth_bps / 8.0  # shorter: no sample (sample-pays)
        self.min_sample_files = min_sample_files
        self.source, self.destination = source, destination
        self._observe_every = observe_every_s
        self._clock = clock
        self._chunks: dict[str, _Chunk] = {}
        self._assigned: dict[str, str] = {}
        self._started = False
        self._updates = 0
        self._allocated = False
        self._layouts: dict[str, Settings] = {}
        self._held: set[str] = set()
        self._last: tuple | None = None
        self._reason = f"{self._tag}: waiting for files"
        self.decisions: list[dict] = []  # what was predicted per chunk (for logs, tests and benchmarks)
        self.sample_plans: list[dict] = []  # sample-pays: each chunk's sample size and why

    # -- what the driver asks ----------------------------------------------------------------
    @property
    def observe_every_s(self) -> float | None:
        """Observe this often while a sample runs or samples are being planned (None: the driver's own interval)."""
        return self._observe_every if self._planning or any(c.sampling for c in self._chunks.values()) else None

    def cluster_of(self, file: FileInfo) -> str:
        known = self._assigned.get(file.path)
        if known is not None:
            return known
        name = chunk_of(file.size, self.path.bdp_bytes)
        c = self._chunks.setdefault(name, _Chunk(name))
        c.files += 1
        c.bytes += file.size
        cluster = name
        if (self.has_history and not c.sample_closed
                and (c.sample_files < self.min_sample_files or c.sample_bytes < self.sample_target)):
            c.sample_files += 1
            c.sample_bytes += file.size
            cluster = name + SAMPLE
        self._assigned[file.path] = cluster
        return cluster

    def suggest(self) -> Suggestion:
        layouts = tuple(ClusterLayout(n, s.cc, s.p, s.pp) for n, s in sorted(self._layouts.items()))
        held = frozenset(self._held)
        # a new reason is a new decision even on the same channels (no sample, the heuristic kept): the driver
        # records and logs it; the reason changes only at decisions, so the steady state stays unchanged
        key = (layouts, held, self._reason)
        changed = key != self._last
        self._last = key
        return Suggestion(layouts, self._reason, changed, held=held)

    # -- the Scheduler ----------------------------------------------------------------------
    def update(self, observation: Observation) -> None:
        obs = observation
        notes: list[str] = []
        if not self._started:
            self._started = True
            for c in self._chunks.values():
                c.sample_closed = True  # later arrivals are transferred, not sampled
            if not self.has_history:
                notes.append("no transfer history (run `fstream calibrate` or any transfer first): heuristic")
        if self.has_history and not self._loading and self.history is None:
            self.has_history = False  # the source finished without a history (a Redis error): heuristic
            notes.append("the transfer history could not be loaded: heuristic")
        first, self._updates = self._updates == 0, self._updates + 1
        self._measure(obs)
        if self._planning:  # sample-pays: every chunk at the heuristic until each one's sample is planned
            # not in the first update: its layout goes out before the first byte, which never waits for a fit
            notes.append(("" if first else self._fit_one()) or "every chunk at the heuristic while the history "
                         "loads and the models are fitted (no sample before they say whether one pays)")
        if not self._planning:
            for c in self._ordered():
                if (c.sample_bps is not None or c.skipped) and c.prediction is None and c.settings is None:
                    if c.fitted is None and self.has_history and self._loading:
                        continue  # the history is still loading: the rest of the chunk waits for the model
                    notes.append(self._predict(c, obs))
            running = next((c for c in self._ordered() if c.sampling), None)
            started = False
            if running is None:
                nxt = next((c for c in self._ordered() if c.sample_files and c.sample_start is None and not c.skipped),
                           None)
                if nxt is not None:
                    notes.append(self._start_sample(nxt, obs))
                    running, started = nxt, True
            waiting = any((c.sample_bps is not None or c.skipped) and c.settings is None for c in self._ordered())
            if running is not None or waiting:
                # not in the update that starts a sample: its layout is applied when this returns (for the first
                # sample: before the transfer's first byte), and a cached history is ready that early
                fit_note = "" if started else self._fit_one()
                if fit_note:
                    notes.append(fit_note)
            elif not self._allocated:
                notes.append(self._allocate())
            else:
                notes.extend(self._late_chunks())
        self._refresh_layouts(obs)
        if notes:
            self._reason = f"{self._tag}: " + "; ".join(notes)
        elif not self._layouts:
            self._reason = f"{self._tag}: no pending files"

    @property
    def _planning(self) -> bool:
        """``sample-pays``, before every chunk's sample is planned (the history loading, the models being fitted)."""
        return (self.has_history and (self.variant is None or self.variant.on("sample-pays"))
                and any(c.sample_files and not c.planned and c.sample_bps is None for c in self._ordered()))

    def _ordered(self) -> list[_Chunk]:
        return [self._chunks[n] for n in CHUNKS if n in self._chunks]

    def _measure(self, obs: Observation) -> None:
        for c in self._ordered():
            if not c.sampling:
                continue
            st = obs.clusters.get(c.name + SAMPLE)
            if st is not None:
                c.sample_moved += st.bytes
            done = st is None or (st.pending_files == 0 and st.active_channels == 0)
            goal = c.sample_bytes if c.sample_goal is None else c.sample_goal
            if c.sample_moved >= goal or (done and obs.t > c.sample_start):
                seconds = max(obs.t - c.sample_start, 1e-3)
                c.sample_bps = c.sample_moved * 8 / seconds

    def _start_sample(self, c: _Chunk, obs: Observation) -> str:
        avg = c.sample_bytes / max(1, c.sample_files)
        c.sample_settings = heuristic(avg, c.sample_files, self.path)
        c.sample_start = obs.t
        s = c.sample_settings
        return (f"sample {c.name}: {c.sample_files} files {fmt_size(c.sample_bytes)} at cc={s.cc} p={s.p} "
                f"pp={s.pp} (heuristic)")

    def _request(self, c: _Chunk) -> Any:
        return request_for(self.path, c.name, c.bytes / max(1, c.files), c.files, self.source, self.destination)

    @property
    def optimizer(self) -> Any:
        if self._optimizer is None:
            self._optimizer = optimizer_for(self.path, self.variant, fit_cache_of(self._source))
        return self._optimizer

    @property
    def _loading(self) -> bool:
        src = self._source
        return callable(src) and not getattr(src, "ready", True)

    @property
    def history(self) -> Any:
        """The history DataFrame, or None while its source is still loading it."""
        src = self._source
        return src() if callable(src) else src

    def _fit_one(self) -> str:
        """Fit the next chunk that has no model yet (one per call, so an update stays short)."""
        c = next((c for c in self._ordered() if c.fitted is None and c.sample_files and self.has_history), None)
        if c is None or self.history is None:
            return ""
        t0 = self._clock()
        self._fit_for(c)
        own = "while its sample runs" if c.sampling else "while a sample runs" if any(
            x.sampling for x in self._ordered()) else "while the heuristic runs"
        plan = self._plan(c)
        if isinstance(c.fitted, Exception):
            return f"{c.name}: no model ({c.fitted})" + plan
        reused = getattr(c.fitted, "reused", 0)
        total = len(c.fitted.groups) + len(c.fitted.dropped) if reused else 0
        return (f"{c.name}: models fitted in {self._clock() - t0:.2f} s " + own
                + (f" ({reused} of {total} groups unchanged since an earlier fit)" if reused else "") + plan)

    def _plan(self, c: _Chunk) -> str:
        """``sample-pays``: whether the chunk's sample can pay for itself, and its size (``harp_sample_cost``)."""
        if self.variant is not None and not self.variant.on("sample-pays"):
            return ""
        if c.sample_bps is not None or c.planned:
            return ""  # its sample is over, or already planned
        from fstream_provider.tuning.harp_sample_cost import plan_sample

        fitted = c.fitted
        groups = () if fitted is None or isinstance(fitted, Exception) else fitted.groups
        no_model = str(fitted) if isinstance(fitted, Exception) else getattr(fitted, "reason", "no history")
        s = c.sample_settings or heuristic(c.sample_bytes / max(1, c.sample_files), c.sample_files, self.path)
        plan = plan_sample(groups, sample_settings=(s.cc, s.p, s.pp), paper_bytes=float(c.sample_bytes),
                           chunk_bytes=float(c.bytes), min_bytes=self.min_sample_bytes,
                           bandwidth_bps=self.path.bandwidth_bps, no_model=no_model)
        c.sample_goal = plan.bytes if plan.bytes < c.sample_bytes else None
        c.planned = True
        self.sample_plans.append({"chunk": c.name, "bytes": plan.bytes, "paper_bytes": c.sample_bytes,
                                  "reason": plan.reason, "gain_s": plan.gain_s, "cost_s": plan.cost_s})
        return f"; {c.name}: {plan.reason}"

    def _predict(self, c: _Chunk, obs: Observation) -> str:
        if c.fitted is None:
            self._fit_for(c)
        s = c.sample_settings
        if c.skipped:
            sample_note = f"{c.name} without a sample"
        else:
            sample_note = f"sample {c.name} {fmt_bps(c.sample_bps)} at cc={s.cc} p={s.p} pp={s.pp}"
        if isinstance(c.fitted, Exception) or c.fitted is None:
            c.settings = self._heuristic(c)
            return f"{sample_note}; {c.name}: heuristic ({c.fitted or 'no history'})"
        pred = self.optimizer.predict(c.fitted, None if c.skipped else (s.cc, s.p, s.pp, c.sample_bps))
        c.prediction = pred
        self.decisions.append({"chunk": c.name, "sample_bps": None if c.skipped else c.sample_bps, "cc": pred.cc,
                               "p": pred.p, "pp": pred.pp, "predicted_bps": pred.throughput_bps,
                               "fallback": pred.fallback, "reason": pred.reason, "t": obs.t})
        if pred.fallback:
            c.settings = self._heuristic(c)
            return f"{sample_note}; {c.name}: heuristic ({pred.reason})"
        c.settings = clamp(Settings(pred.cc, pred.p, pred.pp), self.path)
        return f"{sample_note}; {c.name}: {pred.reason}"

    def _fit_for(self, c: _Chunk) -> None:
        history = self.history if self.has_history else None
        if history is None:
            c.fitted = None
            return
        try:
            c.fitted = self.optimizer.fit(history, self._request(c))
        except ValueError as exc:
            c.fitted = exc

    def _heuristic(self, c: _Chunk) -> Settings:
        if c.skipped or c.sample_goal is not None:  # no sample, or one cut short: the chunk's files as a whole
            return heuristic(c.bytes / max(1, c.files), c.files, self.path)
        rest = max(1, c.files - c.sample_files)
        avg = max(1.0, (c.bytes - c.sample_bytes) / rest) if c.files > c.sample_files else c.bytes / max(1, c.files)
        return heuristic(avg, rest, self.path)

    def _allocate(self) -> str:
        """Algorithm 1 lines 9–23: distribute the largest concurrency by chunk size and unit throughput."""
        from fstream_provider.tuning.harp_model import allocate_channels

        self._allocated = True
        for c in self._ordered():
            if c.settings is None:  # no sample (no history, or nothing left after it): heuristic
                c.settings = self._heuristic(c)
        predicted = [(c.name, float(max(1, c.rest_bytes)), c.prediction) for c in self._ordered()
                     if c.prediction is not None and not c.prediction.fallback and self._has_rest(c)
                     and c.prediction.unit_bps > 0]  # no unit throughput: the chunk keeps its predicted cc
        notes = []
        if predicted:
            cc = allocate_channels(predicted)
            for name, n in cc.items():
                c = self._chunks[name]
                c.settings = Settings(n, c.settings.p, c.settings.pp)
            notes.append("Algorithm 1 channels " + ", ".join(f"{n}={v}" for n, v in cc.items()))
        wanted = {c.name: c.settings.cc for c in self._ordered() if self._has_rest(c)}
        if sum(wanted.values()) > self.path.max_cc:  # applied per round by _refresh_layouts (fit_cc)
            notes.append(f"shared within max_cc={self.path.max_cc} while chunks overlap")
        shown = ", ".join(f"{c.name} cc={c.settings.cc} p={c.settings.p} pp={c.settings.pp}"
                          for c in self._ordered() if self._has_rest(c))
        return "start " + (shown or "nothing left after the samples") + (f" ({'; '.join(notes)})" if notes else "")

    @staticmethod
    def _has_rest(c: _Chunk) -> bool:
        """Files of the chunk move with its own settings: beyond its sample, or left by a sample skipped or cut."""
        return c.files > c.sample_files or c.skipped or (c.sample_goal is not None and c.rest_bytes > 0)

    def _late_chunks(self) -> list[str]:
        """A chunk first seen after the allocation: predicted without a sample, else the heuristic."""
        notes = []
        for c in self._ordered():
            if c.settings is not None:
                continue
            self._fit_for(c)
            if c.fitted is not None and not isinstance(c.fitted, Exception):
                pred = self.optimizer.predict(c.fitted, None)
                if not pred.fallback:
                    c.prediction, c.settings = pred, clamp(Settings(pred.cc, pred.p, pred.pp), self.path)
                    notes.append(f"{c.name} (arrived later, no sample): {pred.reason}")
                    continue
            c.settings = self._heuristic(c)
            notes.append(f"{c.name} (arrived later): heuristic cc={c.settings.cc} p={c.settings.p} pp={c.settings.pp}")
        return notes

    @staticmethod
    def _share(layouts: dict[str, Settings], name: str, settings: Settings, obs: Observation) -> None:
        """When a chunk's own files and its sample's run with the same ``settings``, its cc is shared by bytes."""
        main, rest = layouts.get(name), layouts.get(name + SAMPLE)
        if main != settings or rest != settings or settings.cc < 2:
            return
        pb = {n: float(max(1, getattr(obs.clusters.get(n), "pending_bytes", 1))) for n in (name, name + SAMPLE)}
        k = min(settings.cc - 1, max(1, round(settings.cc * pb[name + SAMPLE] / sum(pb.values()))))
        layouts[name + SAMPLE] = Settings(k, settings.p, settings.pp)
        layouts[name] = Settings(settings.cc - k, settings.p, settings.pp)

    def _refresh_layouts(self, obs: Observation) -> None:
        layouts: dict[str, Settings] = {}
        held: set[str] = set()
        planning = self._planning
        for c in self._ordered():
            if planning:  # the whole chunk (its sample's files too) at the heuristic, as ``static`` would run it
                whole = heuristic(c.bytes / max(1, c.files), c.files, self.path)
                for n in (c.name, c.name + SAMPLE):
                    st = obs.clusters.get(n)
                    if st is not None and (st.pending_files > 0 or st.active_channels > 0):
                        layouts[n] = whole
                self._share(layouts, c.name, whole, obs)
                continue
            rest = obs.clusters.get(c.name + SAMPLE)
            if c.sampling and c.sample_settings is not None:
                layouts[c.name + SAMPLE] = c.sample_settings
            elif (c.skipped or c.sample_goal is not None) and rest is not None and (
                    rest.pending_files > 0 or rest.active_channels > 0):
                # a sample skipped or cut: its files left move with the chunk's settings from the allocation on;
                # until then a sample that had started goes on at its own (the link never waits for the model)
                if self._allocated and c.settings is not None:
                    layouts[c.name + SAMPLE] = c.settings
                elif c.sample_start is not None and c.sample_settings is not None:
                    layouts[c.name + SAMPLE] = c.sample_settings
                else:
                    held.add(c.name + SAMPLE)
            elif c.sample_files and c.sample_start is None and not c.skipped:
                held.add(c.name + SAMPLE)
            main = obs.clusters.get(c.name)
            if main is None or (main.pending_files <= 0 and main.active_channels <= 0):
                continue  # nothing of this chunk outside its sample waits or moves
            if self._allocated and c.settings is not None:
                layouts[c.name] = c.settings
            else:
                held.add(c.name)
        if self._allocated:  # a chunk's settings over its own files and its sample's left
            for c in self._ordered():
                if c.settings is not None:
                    self._share(layouts, c.name, c.settings, obs)
        if sum(s.cc for s in layouts.values()) > self.path.max_cc:  # never more channels than allowed in total
            weights = {n: float(max(1, getattr(obs.clusters.get(n), "pending_bytes", 1))) for n in layouts}
            fitted = fit_cc({n: s.cc for n, s in layouts.items()}, self.path.max_cc, weights)
            layouts = {n: Settings(fitted[n], s.p, s.pp) for n, s in layouts.items()}
        self._layouts, self._held = layouts, held
