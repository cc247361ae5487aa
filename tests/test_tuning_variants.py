"""FStream's variants: the thesis' Alg. 2 and Alg. 3 against traces worked by hand from the text, and the switches."""

import pytest

from fstream_provider.model.spec import TransferSpec
from fstream_provider.tuning.base import ClusterStats, FileInfo, Observation, PathInfo
from fstream_provider.tuning.fstream import FStreamTuner
from fstream_provider.tuning.profile_history import ProfileHistory, ProfileRecord
from fstream_provider.tuning.profiler import OnlineProfiler
from fstream_provider.tuning.qos import QosController
from fstream_provider.tuning.registry import make_tuner
from fstream_provider.tuning.variants import DEFAULT, DEFAULT_SWITCHES, SWITCHES, THESIS, FStreamVariant

G = 1e9
DEST = "fstream://127.0.0.1:9/x"


def test_variant_text_parses_round_trips_and_names_bad_parts():
    assert FStreamVariant.parse("thesis") == THESIS and FStreamVariant.parse(None) == DEFAULT
    v = FStreamVariant.parse("thesis+jump+pacing")
    assert v.switches == {"jump", "pacing"} and v.name == "thesis+jump+pacing"
    assert FStreamVariant.parse("default-pacing").switches == DEFAULT_SWITCHES - {"pacing"}
    for text in ("thesis", "default", "default-pacing-jump", "thesis+p90", "default+history-ftype"):
        assert FStreamVariant.parse(FStreamVariant.parse(text).name) == FStreamVariant.parse(text)
    assert (THESIS.p, DEFAULT.p, FStreamVariant.parse("thesis", utilisation=0.7).p) == (0.8, 0.9, 0.7)
    assert THESIS.interval_for(0.040) == 10.0 and DEFAULT.interval_for(0.040) == 2.0
    assert DEFAULT.interval_for(0.2) == 10.0 and FStreamVariant.parse("thesis", interval_s=3).interval_for(1) == 3
    assert "history-ftype" in SWITCHES and "history-ftype" not in DEFAULT_SWITCHES
    with pytest.raises(ValueError, match=r"fstream variant 'thsis': expected 'thesis' or 'default'"):
        FStreamVariant.parse("thsis")
    with pytest.raises(ValueError, match=r"unknown switch 'jmp'; known: start-history"):
        FStreamVariant.parse("thesis+jmp")
    with pytest.raises(ValueError, match=r"utilisation 1.5: must be between 0.05 and 1"):
        FStreamVariant.parse("thesis", utilisation=1.5)
    with pytest.raises(ValueError, match=r"band 0.9: must be between 0.01 and 0.5"):
        FStreamVariant.parse(None, band=0.9)


def test_alg2_as_written_hand_worked_trace():
    """Alg. 2 with p = 0.8, 15 % band, no guard, unbounded decrease (10 Gbit/s link)."""
    prof = OnlineProfiler(bandwidth_bps=10 * G, max_cc=32, utilisation=0.8, band=0.15, guard=False,
                          bounded_decrease=False)
    # 2 Gbit/s at cc=2: 1 Gbit/s per channel needs 8, at most doubling (line 11) -> 4
    assert prof.step(2, 2 * G).cc == 4
    assert prof.step(4, 4 * G).cc == 8          # needs 8, doubling allows 8
    assert prof.step(8, 7.5 * G).cc == 8        # |7.5 - 8| = 0.5 <= 15 % of 8: kept
    d = prof.step(8, 11 * G)                    # line 24: the bandwidth rises to 11, desired 8.8
    assert prof.bandwidth_bps == 11 * G and d.cc == 7 and "bandwidth raised" in d.reason  # ceil(8.8 / 1.375)
    assert prof.step(7, 6 * G, history_cc=12).cc == 12  # lines 4-5: history's answer replaces the extrapolation
    low = OnlineProfiler(bandwidth_bps=10 * G, max_cc=32, utilisation=0.3, guard=False, bounded_decrease=False)
    assert low.step(16, 9.5 * G).cc == 6        # 3 Gbit/s wanted at 0.59 per channel: straight to 6
    ours = OnlineProfiler(bandwidth_bps=10 * G, max_cc=32, utilisation=0.3)
    assert ours.step(16, 9.5 * G).cc == 8       # bounded decrease: at most halving


def test_alg3_as_written_hand_worked_ladder():
    """Alg. 3: >50 % doubles/halves, 20-50 % +-2, 10-20 % +-1, 5-10 % a p/pp step, < 5 % holds."""
    q = QosController(target_bps=1 * G, max_cc=32, jump=False, guard=False)
    trace = [(2, 0.3, 4, 0), (4, 0.7, 6, 0), (6, 0.85, 7, 0), (7, 0.93, 7, 1), (7, 0.97, 7, 0),
             (7, 1.6, 3, 0), (3, 1.3, 1, 0), (1, 0.92, 1, 1), (4, 1.07, 4, -1), (4, 1.15, 3, 0)]
    for cc, thr, want_cc, want_fine in trace:
        d = q.step(cc, thr * G)
        assert (d.cc, d.fine) == (want_cc, want_fine), (cc, thr, d)
    jumpy = QosController(target_bps=1 * G, max_cc=32, jump=True)
    assert jumpy.step(2, 0.3 * G).cc == 4  # the jump is bounded by doubling too
    assert jumpy.step(10, 0.6 * G).cc == 17  # 0.06 per channel: 17 for 1 Gbit/s (ladder: 12)


PATH = PathInfo(10 * G, 0.040, tcp_buffer=4 * 2**20, max_cc=32)


def _files(n: int, size: int) -> list[FileInfo]:
    return [FileInfo(f"f{i}", size, "dat") for i in range(n)]


def _interval(t: float, dt: float, thr: float, pending: int, cc: int, cluster: str = "large") -> Observation:
    from fstream_provider.tuning.base import ClusterLayout

    b = int(thr * dt / 8)
    return Observation(t, dt, b, thr, clusters={cluster: ClusterStats(b, thr, cc, pending, pending * 10**9)},
                       layouts=(ClusterLayout(cluster, cc, 1, 0),))


def _history() -> ProfileHistory:
    return ProfileHistory([ProfileRecord(2e9, "large", "dat", 12, 1, 0, 9e9, 1.0)])


def test_thesis_consults_history_only_out_of_band_and_decides_every_10s():
    t = FStreamTuner(path=PATH, history=_history(), variant=THESIS)
    t.update(Observation(0.0, 0.0, new_files=_files(100, 2 * 10**9)))
    first = t.suggest()
    assert "history" not in first.reason and first.total_cc() == 2  # the heuristic's start
    for k in range(1, 5):  # observations every 2 s accumulate until 10 s
        t.update(_interval(2.0 * k, 2.0, 2 * G, 98, 2))
        assert "measuring" in t.suggest().reason and t.suggest().total_cc() == 2
    t.update(_interval(10.0, 2.0, 2 * G, 98, 2))
    s = t.suggest()
    assert "history" in s.reason and s.total_cc() == 12, s.reason
    ours = FStreamTuner(path=PATH, history=_history())  # default: history at t = 0 already
    ours.update(Observation(0.0, 0.0, new_files=_files(100, 2 * 10**9)))
    assert "history" in ours.suggest().reason and ours.suggest().total_cc() == 12


def test_thesis_profiles_starved_intervals_default_skips_them():
    for variant, moved in ((THESIS, True), (DEFAULT, False)):
        t = FStreamTuner(path=PATH, variant=FStreamVariant(variant.switches, interval_s=2.0))
        t.update(Observation(0.0, 0.0, new_files=_files(3, 2 * 10**9)))
        cc = t.suggest().total_cc()
        # channels ran out of files (1 queued for 2 channels); with none queued at all the layout would not move
        # whatever profiling decided (nothing to carry: tests/test_tails.py), so one file stays queued
        t.update(_interval(2.0, 2.0, 1 * G, 1, cc))
        assert (t.suggest().total_cc() > cc) is moved, (variant.name, t.suggest().reason)


def test_variant_reaches_the_tuner_from_spec_and_is_refused_by_other_tuners():
    spec = TransferSpec.from_options(["/a"], DEST, tuner="fstream", variant="thesis+jump", utilisation=0.75,
                                     band=0.1, profile_interval="4s")
    v = spec.tuner_variant()
    assert v.switches == {"jump"} and (v.p, v.band, v.interval_s) == (0.75, 0.1, 4.0)
    tuner = make_tuner("fstream", path=PATH, variant=v)
    assert tuner.variant == v and tuner.min_window_s == 4.0 and tuner.observe_every_s == 4.0
    assert TransferSpec.from_options(["/a"], DEST, tuner="fixed").tuner_variant() is None
    with pytest.raises(ValueError, match=r"tuner 'fixed' has no variants: only 'fstream', 'harp'"):
        TransferSpec.from_options(["/a"], DEST, tuner="fixed", variant="thesis")
    with pytest.raises(ValueError, match=r"tuner 'harp' takes no utilisation or band.*only 'fstream'"):
        TransferSpec.from_options(["/a"], DEST, tuner="harp", band=0.1)
    with pytest.raises(ValueError, match=r"unknown switch 'fast'"):
        TransferSpec.from_options(["/a"], DEST, variant="default+fast")
    with pytest.raises(ValueError, match=r"utilisation 0.0: must be between 0.05 and 1"):
        TransferSpec.from_options(["/a"], DEST, utilisation=0.0)
