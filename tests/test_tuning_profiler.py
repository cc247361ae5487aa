"""Online profiling (Alg. 2) and the QoS controller as pure state machines."""

from __future__ import annotations

from fstream_provider.tuning.profiler import OnlineProfiler
from fstream_provider.tuning.qos import QosController


def test_within_band_holds_and_below_extrapolates_at_most_doubling():
    prof = OnlineProfiler(bandwidth_bps=10e9, max_cc=32, utilisation=0.8, band=0.15)
    assert prof.step(4, 7.5e9).cc == 4                       # 6.8..9.2 Gbit/s band
    d = prof.step(2, 1e9)                                    # 0.5 Gbit/s per channel needs 16
    assert d.cc == 4 and "at most doubling" in d.reason
    d = prof.step(4, 5e9)                                    # 1.25 per channel -> ceil(8/1.25) = 7
    assert d.cc == 7


def test_history_answer_is_used_when_given():
    prof = OnlineProfiler(bandwidth_bps=10e9, max_cc=32)
    d = prof.step(2, 1e9, history_cc=12, history_note="by size 64MiB/h5")
    assert d.cc == 12 and "history" in d.reason


def test_bandwidth_is_raised_when_exceeded():
    prof = OnlineProfiler(bandwidth_bps=1e9, max_cc=32, utilisation=0.9)
    d = prof.step(4, 2e9)
    assert prof.bandwidth_bps == 2e9 and "bandwidth raised" in d.reason
    assert d.cc == 4  # 2 Gbit/s is within 15 % of 0.9 * 2 Gbit/s


def test_an_increase_that_buys_nothing_is_undone_and_capped():
    prof = OnlineProfiler(bandwidth_bps=10e9, max_cc=32)
    assert prof.step(4, 4e9).cc == 8
    d = prof.step(8, 4.1e9)                                  # storage-bound: +2.5 % only
    assert d.cc == 4 and "plateau" in d.reason
    assert prof.step(4, 4e9).cc < 8                          # stays under the ceiling


def test_qos_jumps_by_per_channel_rate_then_holds():
    q = QosController(target_bps=6e9, max_cc=32)
    d = q.step(2, 1e9)                                        # 0.5 per channel: wants 12, doubling caps at 4
    assert d.cc == 4
    d = q.step(4, 4.8e9)                                      # -20 %: 1.2 per channel -> 5
    assert d.cc == 5
    assert q.step(5, 5.9e9).cc == 5                           # inside 5 %: hold
    d = q.step(5, 5.6e9)                                      # -6.7 %: fine step on p/pp
    assert d.cc == 5 and d.fine == 1
    d = q.step(5, 9e9)                                        # +50 %: down, at most halving
    assert 2 <= d.cc < 5
