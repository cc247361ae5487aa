"""Heuristic formulas (DESIGN.md reading of thesis Alg. 1) and the 0.4 s clustering rule."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from fstream_provider.tuning.base import FileInfo, PathInfo
from fstream_provider.tuning.clustering import Clustering, classify
from fstream_provider.tuning.heuristic import Settings, heuristic, heuristic_raw

MiB = 2**20


def test_formulas_for_small_files():
    # BDP 5 MB, 1 MiB buffer, 500 kB files: pp = round(10) = 10, p = min(5, 1) = 1, cc = max(10, 2) = 10
    assert heuristic_raw(500_000, 1000, 5_000_000, MiB, 32) == Settings(cc=10, p=1, pp=10)


def test_formulas_for_large_files():
    # 120 MB files: pp = round(0.04) = 0, p = min(ceil(5e6/MiB)=5, ceil(120e6/MiB)=115) = 5, cc = max(0, 2) = 2
    assert heuristic_raw(120e6, 20, 5_000_000, MiB, 32) == Settings(cc=2, p=5, pp=0)


def test_cc_bounded_by_file_count_and_max_cc_and_pp_by_100():
    assert heuristic_raw(1000, 3, 5_000_000, MiB, 32).cc == 3
    assert heuristic_raw(1000, 10_000, 5_000_000, MiB, 32).cc == 32
    assert heuristic_raw(1000, 10_000, 5_000_000, MiB, 32).pp == 100


def test_heuristic_uses_path_bdp():
    path = PathInfo(1e9, 0.04, tcp_buffer=MiB, max_cc=8, max_p=4, max_pp=50)
    s = heuristic(200_000, 100, path)  # BDP 5 MB -> ratio 25
    assert s == Settings(cc=8, p=1, pp=25)
    assert heuristic(1e9, 100, path).p == 4  # clamped to max_p


def test_heuristic_refuses_nonsense():
    with pytest.raises(ValueError, match="avg_file_size"):
        heuristic_raw(0, 1, 1e6, MiB, 4)


@given(avg=st.floats(1, 1e12), n=st.integers(0, 10**6), bw=st.floats(1e6, 1e12), rtt=st.floats(1e-4, 1.0),
       buf=st.integers(1024, 2**30), max_cc=st.integers(1, 64), max_p=st.integers(1, 64), max_pp=st.integers(0, 200))
def test_heuristic_always_within_bounds(avg, n, bw, rtt, buf, max_cc, max_p, max_pp):
    path = PathInfo(bw, rtt, tcp_buffer=buf, max_cc=max_cc, max_p=max_p, max_pp=max_pp)
    s = heuristic(avg, n, path)
    assert 1 <= s.cc <= max_cc and 1 <= s.p <= max_p and 0 <= s.pp <= max_pp


def test_small_means_under_0_4_seconds_at_the_bandwidth():
    assert classify(49_999_999, 1e9) == "small"  # 0.39999 s at 1 Gbit/s
    assert classify(50_000_000, 1e9) == "large"


def test_arrivals_merge_into_existing_cluster_or_create_one():
    c = Clustering(bandwidth_bps=1e9)
    assert c.merge([FileInfo("a", 10**8, "h5")]) == {"large"}
    assert c.merge([FileInfo("b", 2 * 10**8, "h5"), FileInfo("c", 10**6, "txt")]) == {"large", "small"}
    assert c.get("large").files == 2 and c.get("large").avg_size == 1.5e8
    assert c.get("small").ftype == "txt"
