"""The one list of built tuners: each one's name, factory, summary and the options it takes; ``make_tuner``.

The CLI's ``--tuner`` choices, the transfer spec's validation, the Airflow operator, the
example DAGs and the benchmarks all read ``TUNERS`` here, so a tuner that is not built cannot
be offered anywhere, and an option a tuner would ignore is refused before anything runs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from fstream_provider.tuning.heuristic import StartLayout

if TYPE_CHECKING:
    from fstream_provider.tuning.base import PathInfo, Tuner
    from fstream_provider.tuning.profile_history import ProfileHistory


def _lazy(module: str, name: str) -> Any:
    """``module``'s ``name`` (dotted), imported when first used: a process imports only the tuner it runs
    (issue 42: a benchmark's provenance covers the code it ran, so ``fixed`` does not hash HARP)."""
    obj: Any = importlib.import_module("fstream_provider.tuning." + module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _parse(module: str, name: str) -> Callable[..., Any]:
    return lambda *args, **kwargs: _lazy(module, name)(*args, **kwargs)


@dataclass(frozen=True)
class TunerArgs:
    """What a factory gets (each tuner uses what its ``TunerInfo`` says it takes).

    :param path: the path description.
    :param start: the user's cc/p/pp (the layout of ``fixed``, the start of an adaptive tuner).
    :param target: QoS target in bits/s.
    :param history: profiling history.
    :param start_time: wall-clock start, for history timestamps.
    :param transfer_history: HARP's transfer history.
    :param variant: the tuner's variant (``FStreamVariant``, ``HarpVariant``; None: its default).
    """

    path: PathInfo
    start: StartLayout = StartLayout()
    target: float | None = None
    history: ProfileHistory | None = None
    start_time: float = 0.0
    transfer_history: Any = None
    variant: Any = None


Factory = Callable[[TunerArgs], "Tuner"]


@dataclass(frozen=True)
class TunerInfo:
    """One built tuner.

    :param name: what users type (``--tuner NAME``, ``tuner="NAME"``).
    :param summary: one line saying what it does.
    :param factory: ``factory(TunerArgs)``.
    :param layout: what cc/p/pp mean to it: ``"settings"`` (used for the whole transfer),
        ``"start"`` (the starting point it searches from), or ``""`` (refused: see ``no_layout``).
    :param no_layout: why cc/p/pp are refused (when ``layout`` is empty).
    :param holds_target: it can hold a target throughput (QoS).
    :param uses_history: it reads and extends the profiling history.
    :param uses_transfer_history: it reads HARP's transfer history (a DataFrame of ``harp_history.COLUMNS``).
    :param variant_of: parses its ``--variant`` text (the paper's algorithms as written, ours, switches);
        None: it has no variants.
    :param takes_profiling: it runs the thesis' online profiling, so ``--utilisation`` and ``--band`` apply.
    :param takes_interval: its layout can change between arrivals of files, so how often it is consulted
        (``--profile-interval``) changes what it does; a tuner without it is consulted at every arrival anyway.
    :param no_interval: why ``--profile-interval`` is refused (when ``takes_interval`` is False).
    """

    name: str
    summary: str
    factory: Factory
    layout: str = ""
    no_layout: str = ""
    holds_target: bool = False
    uses_history: bool = False
    uses_transfer_history: bool = False
    variant_of: Callable[..., Any] | None = None
    takes_profiling: bool = False
    takes_interval: bool = False
    no_interval: str = ""

    @property
    def takes_variant(self) -> bool:
        return self.variant_of is not None

    @property
    def adaptive(self) -> bool:
        """It searches from measurements, so cc/p/pp are its starting point."""
        return self.layout == "start"


def _fixed(a: TunerArgs) -> Tuner:
    s = a.start
    return _lazy("fixed", "FixedTuner")(cc=4 if s.cc is None else s.cc, p=1 if s.p is None else s.p, pp=4 if s.pp is None else s.pp)


def _fstream(a: TunerArgs) -> Tuner:
    return _lazy("fstream", "FStreamTuner")(
        path=a.path, start=a.start, target_throughput_bps=a.target, history=a.history, start_time=a.start_time,
        seed=_lazy("harp_start", "harp_start")(a.path, a.transfer_history),
        variant=a.variant or _lazy("variants", "DEFAULT"))


def _harp(a: TunerArgs) -> Tuner:
    return _lazy("harp", "HarpTuner")(path=a.path, history=a.transfer_history, variant=a.variant)


_ALL = (
    TunerInfo("fixed", "the given cc/p/pp (default 4/1/4) for every file, never changed", _fixed,
              layout="settings",
              no_interval="it keeps the given cc/p/pp for the whole transfer and never looks at a measurement"),
    TunerInfo("static", "the heuristic per cluster on the initial dataset, then kept",
              lambda a: _lazy("dynamic", "StaticTuner")(path=a.path),
              no_layout="it takes cc/p/pp from the heuristic once and never moves, so a starting point "
                        "would be the whole transfer (that is the fixed tuner)",
              takes_interval=True),
    TunerInfo("dynamic", "the heuristic again for every cluster that receives new files",
              lambda a: _lazy("dynamic", "DynamicTuner")(path=a.path),
              no_layout="it takes cc/p/pp from the heuristic on every dataset and measures nothing, "
                        "so there is no search for a starting point to start",
              takes_interval=True),
    TunerInfo("fstream", "dynamic heuristic + online profiling + profiling history + QoS target; starts from "
              "HARP's prediction when transfer history exists", _fstream,
              layout="start", holds_target=True, uses_history=True, uses_transfer_history=True,
              variant_of=_parse("variants", "FStreamVariant.parse"), takes_profiling=True, takes_interval=True),
    TunerInfo("globus", "Globus-like presets by average file size (2 files at once)",
              lambda a: _lazy("baselines", "GlobusTuner")(path=a.path),
              no_layout="its presets by file size are the point of the baseline",
              no_interval="it picks its preset when files arrive (and it is consulted at every arrival) and "
                          "changes nothing in between"),
    TunerInfo("adaptivecc", "heuristic start, concurrency doubled while a utility improves, then kept",
              lambda a: _lazy("baselines", "AdaptiveCCTuner")(path=a.path, start=a.start),
              layout="start", takes_interval=True),
    TunerInfo("harp", "HARP: one sample transfer per chunk, then settings from regression over transfer history",
              _harp, no_layout="its settings come from the history and the sample transfers (the sample "
                               "itself uses the heuristic, as in the paper)", uses_transfer_history=True,
              variant_of=_parse("variants", "HarpVariant.parse"), takes_interval=True),
)

TUNERS: dict[str, TunerInfo] = {t.name: t for t in _ALL}
TUNER_NAMES: tuple[str, ...] = tuple(TUNERS)
DEFAULT_TUNER = "fstream"


def tuner_info(name: str) -> TunerInfo:
    """The built tuner called ``name``; a ``ValueError`` naming the value and the accepted ones otherwise."""
    info = TUNERS.get(name) if isinstance(name, str) else None
    if info is None:
        raise ValueError(f"unknown tuner {name!r}: expected one of {', '.join(TUNER_NAMES)}")
    return info


def _names(pred: Callable[[TunerInfo], bool]) -> str:
    return ", ".join(repr(t.name) for t in _ALL if pred(t))


def check_options(name: str, *, cc: int | None = None, p: int | None = None, pp: int | None = None,
                  target_throughput_bps: float | None = None, variant: bool = False,
                  profiling: bool = False, profile_interval: bool = False) -> TunerInfo:
    """Refuse what tuner ``name`` would ignore, with the reason; return its ``TunerInfo``.

    :param name: the tuner.
    :param cc: channels (the layout of ``fixed``, the starting point of an adaptive tuner).
    :param p: TCP streams per channel (likewise).
    :param pp: files queued ahead per channel (likewise).
    :param target_throughput_bps: a QoS target.
    :param variant: a variant was given (only tuners with ``variant_of`` have variants).
    :param profiling: p or band was given (only tuners with ``takes_profiling``).
    :param profile_interval: a profiling interval was given (only tuners with ``takes_interval``).
    """
    info = tuner_info(name)
    if variant and not info.takes_variant:
        raise ValueError(f"tuner {name!r} has no variants: only {_names(lambda t: t.takes_variant)} run the "
                         "papers' algorithms as written beside ours")
    if profiling and not info.takes_profiling:
        raise ValueError(f"tuner {name!r} takes no utilisation or band: those are the thesis' online "
                         f"profiling settings, which only {_names(lambda t: t.takes_profiling)} runs")
    if profile_interval and not info.takes_interval:
        raise ValueError(f"tuner {name!r} takes no profile_interval (--profile-interval): {info.no_interval}; "
                         f"only {_names(lambda t: t.takes_interval)} can change their settings between "
                         "arrivals of files, at that interval")
    given = {k: v for k, v in (("cc", cc), ("p", p), ("pp", pp)) if v is not None}
    if given and not info.layout:
        shown = ", ".join(f"{k}={v}" for k, v in given.items())
        raise ValueError(
            f"tuner {name!r} takes no cc/p/pp (got {shown}): {info.no_layout}; cc/p/pp are the settings of "
            f"{_names(lambda t: t.layout == 'settings')} and the starting point of {_names(lambda t: t.adaptive)}")
    if target_throughput_bps is not None:
        if target_throughput_bps <= 0:
            raise ValueError(f"target throughput must be > 0 bits/s, got {target_throughput_bps}")
        if not info.holds_target:
            raise ValueError(f"tuner {name!r} cannot hold a target throughput; only "
                             f"{_names(lambda t: t.holds_target)} can")
    return info


def make_tuner(name: str, *, path: PathInfo, cc: int | None = None, p: int | None = None,
               pp: int | None = None, target_throughput_bps: float | None = None,
               history: ProfileHistory | None = None, start_time: float = 0.0, transfer_history: Any = None,
               variant: Any = None) -> Tuner:
    """Return a fresh tuner (options it would ignore are refused by ``check_options``).

    :param name: one of ``TUNER_NAMES``.
    :param path: the path description.
    :param cc: channels: ``fixed`` uses it (default 4), adaptive tuners start from it.
    :param p: streams per channel: ``fixed`` uses it (default 1), adaptive tuners start from it.
    :param pp: pipelining: ``fixed`` uses it (default 4), adaptive tuners start from it.
    :param target_throughput_bps: QoS target (only tuners with ``holds_target``).
    :param history: profiling history (used by tuners with ``uses_history``).
    :param start_time: wall-clock start, for history timestamps.
    :param transfer_history: HARP's transfer history (DataFrame), for tuners with ``uses_transfer_history``.
    :param variant: the tuner's variant (``tuner_variant``; tuners with ``variant_of``; None: its default).
    """
    info = check_options(name, cc=cc, p=p, pp=pp, target_throughput_bps=target_throughput_bps,
                         variant=variant is not None)
    return info.factory(TunerArgs(path, StartLayout(cc, p, pp), target_throughput_bps,
                                  history if info.uses_history else None, start_time,
                                  transfer_history if info.uses_transfer_history else None,
                                  variant))


def tuner_variant(name: str, text: str | None = None, *, utilisation: float | None = None, band: float | None = None,
                  interval_s: float | None = None) -> Any:
    """The variant tuner ``name`` runs: ``FStreamVariant`` (with p, band and the interval) for ``fstream``,
    ``HarpVariant`` for ``harp``; None for a tuner without variants (a text given to one is refused)."""
    info = check_options(name, variant=text is not None, profiling=utilisation is not None or band is not None)
    if info.variant_of is None:
        return None
    extra = {"utilisation": utilisation, "band": band, "interval_s": interval_s} if info.takes_profiling else {}
    return info.variant_of(text, **extra)
