"""Build a tuner by name (``fixed``, ``static``, ``dynamic``, ``fstream``, ``globus``, ``adaptivecc``)."""

from __future__ import annotations

from fstream_provider.tuning.base import PathInfo, Tuner
from fstream_provider.tuning.baselines import AdaptiveCCTuner, GlobusTuner
from fstream_provider.tuning.dynamic import DynamicTuner, StaticTuner
from fstream_provider.tuning.fixed import FixedTuner
from fstream_provider.tuning.fstream import FStreamTuner
from fstream_provider.tuning.profile_history import ProfileHistory

TUNERS = ("fixed", "static", "dynamic", "fstream", "globus", "adaptivecc")


def make_tuner(name: str, *, path: PathInfo, cc: int | None = None, p: int | None = None,
               pp: int | None = None, target_throughput_bps: float | None = None,
               history: ProfileHistory | None = None, start_time: float = 0.0) -> Tuner:
    """Return a fresh tuner.

    :param name: one of ``TUNERS`` (``harp`` is refused until it exists).
    :param path: the path description.
    :param cc: channels for ``fixed`` (default 4).
    :param p: streams per channel for ``fixed`` (default 1).
    :param pp: pipelining for ``fixed`` (default 4).
    :param target_throughput_bps: QoS target (``fstream`` only; other tuners refuse it).
    :param history: profiling history for ``fstream``.
    :param start_time: wall-clock start, for history timestamps (``fstream``).
    """
    if target_throughput_bps is not None and target_throughput_bps <= 0:
        raise ValueError(f"target throughput must be > 0 bits/s, got {target_throughput_bps}")
    if target_throughput_bps is not None and name != "fstream":
        raise ValueError(f"tuner {name!r} cannot hold a target throughput; use --tuner fstream")
    if name == "fixed":
        return FixedTuner(cc=cc if cc is not None else 4, p=p if p is not None else 1,
                          pp=pp if pp is not None else 4)
    if name == "static":
        return StaticTuner(path=path)
    if name == "dynamic":
        return DynamicTuner(path=path)
    if name == "fstream":
        return FStreamTuner(path=path, target_throughput_bps=target_throughput_bps, history=history,
                            start_time=start_time)
    if name == "globus":
        return GlobusTuner(path=path)
    if name == "adaptivecc":
        return AdaptiveCCTuner(path=path)
    if name == "harp":
        raise ValueError("harp tuner not built yet (issue: HARP optimizer); use fstream, dynamic or static")
    raise ValueError(f"unknown tuner {name!r}: expected one of {', '.join(TUNERS)}")
