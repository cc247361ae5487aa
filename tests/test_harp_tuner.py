"""The ``harp`` tuner (HARP's Scheduler, Algorithm 1) and the HARP-seeded ``fstream`` start, driven interval by interval.

The history is synthetic with a known optimum per background load, so what the sample transfer
measures decides which optimum the tuner must pick.
"""

from __future__ import annotations

import numpy as np
import pytest

from fstream_provider.tuning.base import ClusterStats, FileInfo, Observation, PathInfo
from fstream_provider.tuning.clustering import Cluster
from fstream_provider.tuning.fstream import FStreamTuner
from fstream_provider.tuning.harp import SAMPLE, HarpTuner
from fstream_provider.tuning.harp_start import harp_start
from fstream_provider.tuning.harp_history import HistoryRow, chunk_of, to_frame
from fstream_provider.tuning.heuristic import heuristic
from fstream_provider.tuning.registry import make_tuner
from fstream_provider.tuning.variants import HarpVariant

PATH = PathInfo(bandwidth_bps=1e9, rtt_s=0.04, tcp_buffer=1 << 20, max_cc=32)  # BDP 5 MB
SMALL_FILE = 2_000_000  # BDP/10 <= 2 MB < BDP: "small"
#: the paper's sample on every chunk, our other departures on: the tests of the sample's mechanics (the default
#: skips a sample that cannot pay for itself: tests/test_harp_sample_cost.py)
SAMPLED = HarpVariant.parse("default-sample-pays")
GRID = [(cc, p, pp) for cc in (1, 2, 4, 8, 12, 16, 24, 32) for p in (1, 2, 4, 8) for pp in (0, 1, 4, 8)]


def law(cc: int, p: int, pp: int, load: float) -> float:
    """Throughput of the synthetic path: streams fill the link, too many streams cost; pp does not matter.

    Under light load (1.0) the best total is ~16 streams; under heavy load (0.4 of the link left, other
    flows competing) more streams win their share, the best is ~32."""
    streams = cc * p
    link = 1e9 * load
    per_stream = 30e6 if load >= 1 else 12e6
    fill = link * (1 - np.exp(-streams * per_stream / link))
    penalty = (streams / (16 if load >= 1 else 32)) ** 2 * 0.08 * link
    return float(max(fill - penalty, 1e6))


def history(loads=(1.0, 1.0, 1.0, 0.4, 0.4, 0.4), seed=7, chunk="small", size=SMALL_FILE) -> object:
    rng = np.random.default_rng(seed)
    rows = []
    for g, load in enumerate(loads):
        for cc, p, pp in GRID:
            thr = law(cc, p, pp, load) * (1 + rng.normal(0, 0.02))
            rows.append(HistoryRow("src", "dst:1", 1e9, 0.04, 1 << 20, chunk, size, 200, cc, p, pp, thr,
                                   1_700_000_000 + g * 86_400 + len(rows), 1.0, f"cal{g}:{chunk}", kind="probe"))
    return to_frame(rows)


def files(n: int, size: int = SMALL_FILE, prefix: str = "f") -> list[FileInfo]:
    return [FileInfo(f"/{prefix}{i}", size, "h5") for i in range(n)]


def drive_sample(tuner: HarpTuner, dataset: list[FileInfo], sample_bps: float) -> tuple[dict, list[str]]:
    """Feed the tuner what a sender would: t=0 with the dataset, then its sample moving at ``sample_bps``."""
    clusters = {}
    for f in dataset:
        clusters.setdefault(tuner.cluster_of(f), []).append(f)
    pending = {c: len(v) for c, v in clusters.items()}
    sizes = {c: sum(f.size for f in v) for c, v in clusters.items()}
    stats = {c: ClusterStats(pending_files=pending[c], pending_bytes=sizes[c]) for c in clusters}
    tuner.update(Observation(t=0.0, dt=0.0, new_files=dataset, clusters=stats))
    reasons = [tuner.suggest().reason]
    t, dt = 0.0, 0.25
    moved: dict[str, int] = {}
    for _ in range(400):
        s = tuner.suggest()
        active = {l.cluster for l in s.layouts}
        sampling = [c for c in active if c.endswith(SAMPLE)]
        if not sampling:
            break
        t += dt
        st = {}
        for c in clusters:
            if c in sampling:
                b = int(min(sample_bps * dt / 8, sizes[c] - moved.get(c, 0)))
                moved[c] = moved.get(c, 0) + b
                left = sizes[c] - moved[c]
                st[c] = ClusterStats(bytes=b, throughput_bps=b * 8 / dt, active_channels=1 if left else 0,
                                     pending_files=int(np.ceil(left / dataset[0].size)), pending_bytes=left)
            elif moved.get(c, 0) >= sizes[c]:
                continue
            else:
                st[c] = ClusterStats(pending_files=pending[c], pending_bytes=sizes[c])
        tuner.update(Observation(t=t, dt=dt, bytes=sum(x.bytes for x in st.values()), clusters=st))
        reasons.append(tuner.suggest().reason)
    return {l.cluster: l for l in tuner.suggest().layouts}, reasons


def test_without_history_no_sample_is_taken_and_the_heuristic_runs_with_the_reason():
    tuner = HarpTuner(path=PATH, history=None)
    layouts, reasons = drive_sample(tuner, files(40), 500e6)
    assert not any(c.endswith(SAMPLE) for c in layouts) and set(layouts) == {"small"}
    h = heuristic(SMALL_FILE, 40, PATH)
    assert (layouts["small"].cc, layouts["small"].p, layouts["small"].pp) == (h.cc, h.p, h.pp)
    assert "no transfer history" in reasons[0]
    assert tuner.observe_every_s is None


def test_sample_first_with_the_heuristic_rest_held_then_the_prediction_for_the_measured_load():
    hist = history()
    tuner = HarpTuner(path=PATH, history=hist, variant=SAMPLED)
    dataset = files(200)
    assert chunk_of(SMALL_FILE, PATH.bdp_bytes) == "small"
    # the sample is 2 x bandwidth-seconds = 250 MB = 125 files of 2 MB
    clusters = [tuner.cluster_of(f) for f in dataset]
    assert clusters.count("small" + SAMPLE) == 125 and clusters.count("small") == 75
    tuner2 = HarpTuner(path=PATH, history=hist, variant=SAMPLED)
    heavy_layouts, heavy_reasons = drive_sample(tuner2, dataset, law(*_heur(125), load=0.4))
    first = heavy_reasons[0]
    assert "sample small: 125 files" in first and "(heuristic)" in first
    assert tuner2.decisions and tuner2.decisions[0]["chunk"] == "small"
    assert "small" in heavy_layouts and not any(c.endswith(SAMPLE) for c in heavy_layouts)

    light = HarpTuner(path=PATH, history=hist, variant=SAMPLED)
    light_layouts, _ = drive_sample(light, dataset, law(*_heur(125), load=1.0))
    heavy_streams = heavy_layouts["small"].cc * heavy_layouts["small"].p
    light_streams = light_layouts["small"].cc * light_layouts["small"].p
    # the heavy-load sample pulls the prediction to the heavy-load optimum (more streams)
    assert heavy_streams > light_streams, (heavy_layouts, light_layouts)
    assert 8 <= light_streams <= 32 and heavy_streams >= 20


def _heur(n: int) -> tuple[int, int, int]:
    h = heuristic(SMALL_FILE, n, PATH)
    return h.cc, h.p, h.pp


def test_the_rest_of_a_chunk_is_held_while_its_sample_runs_and_the_driver_observes_faster():
    tuner = HarpTuner(path=PATH, history=history(), variant=SAMPLED)
    dataset = files(200)
    for f in dataset:
        tuner.cluster_of(f)
    tuner.update(Observation(t=0.0, dt=0.0, new_files=dataset,
                             clusters={"small" + SAMPLE: ClusterStats(pending_files=125, pending_bytes=250_000_000),
                                       "small": ClusterStats(pending_files=75, pending_bytes=150_000_000)}))
    s = tuner.suggest()
    assert {l.cluster for l in s.layouts} == {"small" + SAMPLE} and s.held == frozenset({"small"})
    assert tuner.observe_every_s == 0.25


def test_two_chunks_are_sampled_one_after_the_other():
    hist = history()
    tuner = HarpTuner(path=PATH, history=hist, variant=SAMPLED)
    dataset = files(20, 200_000, "t") + files(200)  # tiny (200 kB < BDP/10) and small
    layouts, reasons = drive_sample(tuner, dataset, 300e6)
    order = []
    for r in reasons:
        for c in ("tiny", "small"):
            if f"sample {c}:" in r and c not in order:
                order.append(c)
    assert order == ["tiny", "small"]
    assert "sample tiny:" in reasons[0] and "sample small:" not in reasons[0]
    assert set(layouts) == {"small"}  # the tiny chunk was all sample
    assert [d["chunk"] for d in tuner.decisions] == ["tiny", "small"]

    again = HarpTuner(path=PATH, history=hist, variant=SAMPLED)
    for f in dataset:
        again.cluster_of(f)
    again.update(Observation(t=0.0, dt=0.0, new_files=dataset, clusters={
        "tiny" + SAMPLE: ClusterStats(pending_files=20, pending_bytes=4_000_000),
        "small" + SAMPLE: ClusterStats(pending_files=125, pending_bytes=250_000_000),
        "small": ClusterStats(pending_files=75, pending_bytes=150_000_000)}))
    s = again.suggest()
    assert {l.cluster for l in s.layouts} == {"tiny" + SAMPLE} and s.held == {"small" + SAMPLE, "small"}


def test_fstream_starts_from_harps_prediction_when_history_exists():
    seed = harp_start(PATH, history())
    assert seed is not None and harp_start(PATH, None) is None
    c = Cluster("small", files=200, bytes=200 * SMALL_FILE, seen_files=200, seen_bytes=200 * SMALL_FILE)
    got = seed(c)
    assert got is not None
    settings, why = got
    assert "HARP start without sample" in why
    tuner = make_tuner("fstream", path=PATH, transfer_history=history())
    dataset = files(200)
    for f in dataset:
        tuner.cluster_of(f)
    tuner.update(Observation(t=0.0, dt=0.0, new_files=dataset,
                             clusters={"small": ClusterStats(pending_files=200, pending_bytes=200 * SMALL_FILE)}))
    s = tuner.suggest()
    assert "HARP start without sample" in s.reason
    lay = s.layout("small")
    assert (lay.p, lay.pp) == (settings.p, settings.pp) and lay.cc == settings.cc
    plain = make_tuner("fstream", path=PATH)
    for f in dataset:
        plain.cluster_of(f)
    plain.update(Observation(t=0.0, dt=0.0, new_files=dataset,
                             clusters={"small": ClusterStats(pending_files=200, pending_bytes=200 * SMALL_FILE)}))
    assert "HARP" not in plain.suggest().reason and isinstance(tuner, FStreamTuner)


def test_harp_refuses_a_layout_and_bad_settings():
    with pytest.raises(ValueError, match="takes no cc/p/pp"):
        make_tuner("harp", path=PATH, cc=4)
    with pytest.raises(ValueError, match="sample_scale"):
        HarpTuner(path=PATH, sample_scale=0)


def seed_cc(path):
    c = Cluster("small", files=200, bytes=200 * SMALL_FILE, seen_files=200, seen_bytes=200 * SMALL_FILE)
    return harp_start(path, history())(c)[0].cc


class Loading:
    """A history source as the sender's background loader presents it: rows known at once, frame later."""

    def __init__(self, frame, rows=None):
        self.frame, self.rows, self.ready = frame, len(frame) if rows is None else rows, False

    def __call__(self):
        return self.frame if self.ready else None


def test_the_sample_starts_before_the_history_is_loaded_and_the_rest_waits_for_the_model():
    src = Loading(history())
    tuner = HarpTuner(path=PATH, history=src, variant=SAMPLED)
    dataset = files(200)
    first_layouts = None
    clusters = {}
    for f in dataset:
        clusters.setdefault(tuner.cluster_of(f), []).append(f)
    tuner.update(Observation(t=0.0, dt=0.0, new_files=dataset, clusters={
        "small" + SAMPLE: ClusterStats(pending_files=125, pending_bytes=250_000_000),
        "small": ClusterStats(pending_files=75, pending_bytes=150_000_000)}))
    first_layouts = {l.cluster for l in tuner.suggest().layouts}
    assert first_layouts == {"small" + SAMPLE}  # the sample runs although nothing is loaded yet
    # the sample ends while the history still loads: the rest stays held, nothing is decided
    tuner.update(Observation(t=2.0, dt=2.0, bytes=250_000_000, clusters={
        "small" + SAMPLE: ClusterStats(bytes=250_000_000, pending_files=0, active_channels=0),
        "small": ClusterStats(pending_files=75, pending_bytes=150_000_000)}))
    s = tuner.suggest()
    assert s.layouts == () and s.held == {"small"} and not tuner.decisions
    src.ready = True
    tuner.update(Observation(t=2.25, dt=0.25, clusters={"small": ClusterStats(pending_files=75,
                                                                               pending_bytes=150_000_000)}))
    tuner.update(Observation(t=2.5, dt=0.25, clusters={"small": ClusterStats(pending_files=75,
                                                                              pending_bytes=150_000_000)}))
    s = tuner.suggest()
    assert {l.cluster for l in s.layouts} == {"small"} and tuner.decisions and "-> cc=" in s.reason


def test_a_history_that_fails_to_load_falls_back_to_the_heuristic():
    src = Loading(None, rows=500)
    tuner = HarpTuner(path=PATH, history=src)
    src.ready = True  # done, but without a frame (Redis error while loading)
    layouts, reasons = drive_sample(tuner, files(200), 300e6)
    assert set(layouts) == {"small"} and any("could not be loaded: heuristic" in r for r in reasons)


def test_fstream_moves_to_harps_start_when_the_history_arrives_before_profiling_decides():
    src = Loading(history())
    tuner = make_tuner("fstream", path=PATH, transfer_history=src)
    dataset = files(200)
    for f in dataset:
        tuner.cluster_of(f)
    stats = {"small": ClusterStats(pending_files=200, pending_bytes=200 * SMALL_FILE)}
    tuner.update(Observation(t=0.0, dt=0.0, new_files=dataset, clusters=stats))
    assert "HARP" not in tuner.suggest().reason  # not loaded yet: the heuristic starts
    tuner.update(Observation(t=3.0, dt=3.0, bytes=10**8, throughput_bps=2.7e8, clusters=stats))
    assert "waiting for the transfer history (HARP start)" in tuner.suggest().reason  # profiling holds off
    src.ready = True
    from fstream_provider.tuning.base import ClusterLayout
    tuner.update(Observation(t=3.5, dt=3.0, bytes=200_000_000, throughput_bps=5.3e8, clusters=stats,
                             layouts=[ClusterLayout("small", 2, 2, 2)]))  # a full window measured at cc=2
    s = tuner.suggest()
    assert "HARP start without sample" in s.reason and "history ready at 3.5 s" in s.reason
    assert s.layout("small").cc == seed_cc(PATH)  # not moved in the same round by a measurement of the old layout
