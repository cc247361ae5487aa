"""SEAL that shares below the knee: processor sharing while an endpoint wastes nothing by it (issue 44, SEAL §4.3-4.4).

SEAL (``scheduler.SealScheduler``, Listings 1-2) lets a task that is not small wait on a saturated endpoint
until its xfactor is ``pf`` times a running task's, and starts small tasks there with FindThrCC's cc, which on a
saturated end is 1 (one more stream raises no aggregate). At ordinary load that is what loses to the baselines
(BENCHMARKS §10.1): a burst of 1-10 GB tasks saturates the source for a while and SEAL makes all but the
first few wait, while BaseCC4 runs them side by side; and a 100 MB-1 GB task started beside 4-stream tasks
with one stream gets a fifth of their share.

Two changes, each a switch (``admit``, ``fair_small``) so that its gain is shown apart (ablation):

- **admit below the knee** (the hybrid): after SEAL's cycle, an interactive task still waiting at a
  saturated end starts when its fair cc keeps both of its ends at or below their curve's knee
  (``EndpointCurve.knee``: up to there the aggregate does not fall, so sharing costs the running tasks
  only the share they give, and processor sharing is what the baselines win with). Past the knee every
  further stream lowers what the endpoint moves in all, and SEAL's expected-slowdown order decides as
  written: waiting tasks by xfactor, preemption by ``pf``. The load estimate is the board's own: the
  streams running at each end.
- **an equal share** (``fair_small``): a small task that SEAL starts on a saturated end gets at least the
  mean cc of the tasks running at its busier end (processor sharing per task, not per stream), within its
  cap (1 at or below ``single_bytes``) and the ends' room.

Everything else is SEAL's or STEAL's (``config.steal``) unchanged, batch tasks included. Selectable beside SEAL
as written (``sched_sim.make_scheduler('seal-share')`` / ``'steal-share'``); the agents run it on their shared board
(``bus.sched_board.SchedBoard(share=True)``: ``fstream agent --scheduler seal-share|steal-share``).
"""

from __future__ import annotations

from operator import attrgetter

from fstream_provider.tuning.sched_model import LoadModel
from fstream_provider.tuning.scheduler import Action, SealConfig, SealScheduler, Task


class SealShareScheduler(SealScheduler):
    """SEAL or STEAL with the two changes above.

    :param admit: admit a held interactive task while its ends stay at or below their knee.
    :param fair_small: a small task started on a saturated end gets at least the mean cc running there.
    """

    def __init__(self, model: LoadModel, config: SealConfig | None = None, now: float = 0.0, *,
                 admit: bool = True, fair_small: bool = True) -> None:
        super().__init__(model, config, now)
        self.admit, self.fair_small = admit, fair_small
        self._pinned: tuple | None = None  # (task, (cc, rate)) while ``_start`` starts it with a cc of ours

    @property
    def name(self) -> str:
        return super().name + "+share" + ("" if self.admit else "-admit") + ("" if self.fair_small else "-fair")

    def cycle(self, now: float) -> list[Action]:
        actions = super().cycle(now)
        held = sorted((t for t in self.tasks.values() if t.state == "waiting" and t.klass == "interactive"),
                      key=attrgetter("xfactor"), reverse=True) if self.admit else []
        for task in held:
            if not any(self._saturated(h) for h in (task.src, task.dst)):
                continue  # SEAL's own rule held it on ends with room (a gate, a cap): not ours to change
            cc = self._fair_cc(task)
            loads = {h: self._load(h) + cc for h in (task.src, task.dst)}
            if any(n > self.model.curve(h).knee or n > self.cfg.max_total_cc for h, n in loads.items()):
                continue
            thr = self.model.throughput(task.src, task.dst, cc, self._load(task.src), self._load(task.dst))
            actions += self._start_at(task, cc, thr, "saturated but below the knee at " + ", ".join(
                f"{h} {n:g} of {self.model.curve(h).knee:g} streams" for h, n in loads.items()) + ": share")
        return actions

    def _start(self, task: Task, why: str) -> list[Action]:
        """SEAL's start; a small interactive task SEAL starts on a saturated end gets at least its fair cc."""
        if self.fair_small and self._pinned is None and task.klass == "interactive" and self._small(task) and any(
                self._saturated(h) for h in (task.src, task.dst)):
            cc = super()._find_thr_cc(task, False)[0]
            fair = self._fair_cc(task)
            if fair > cc:
                thr = self.model.throughput(task.src, task.dst, fair, self._load(task.src), self._load(task.dst))
                return self._start_at(task, fair, thr, f"{why}; cc {cc} -> {fair}: an equal share beside those running")
        return super()._start(task, why)

    def _start_at(self, task: Task, cc: int, thr: float, why: str) -> list[Action]:
        self._pinned = (task, (cc, thr))
        try:
            return super()._start(task, why)
        finally:
            self._pinned = None

    def _find_thr_cc(self, t: Task, ideal: bool, without: tuple[Task, ...] = ()) -> tuple[int, float]:
        if self._pinned is not None and t is self._pinned[0] and not ideal and not without:
            return self._pinned[1]
        return super()._find_thr_cc(t, ideal, without)

    def _fair_cc(self, task: Task) -> int:
        """The cc that gives ``task`` an equal share beside the tasks running at its busier end: their mean cc,
        within its cap and the ends' room."""
        at = self._sums()[3]
        means = [self._load(h) / len(at[h]) for h in (task.src, task.dst) if at.get(h)]
        room = self.cfg.max_total_cc - max(self._load(task.src), self._load(task.dst))
        return max(1, min(self._cc_cap(task), int(room), round(max(means, default=1))))
