"""``fstream bench ab`` (issue 26): every pair's raw numbers, the median and range, and provenance land in a
result file; the pairs alternate ABBA. Fake sides stand in for the agent, so nothing is sent."""

from __future__ import annotations

import json

import pytest

from fstream_bench.datapath import ab

from fstream_bench import cli

from fstream_bench.core import runstats


class FakeSide:
    calls: list[tuple[str, str]] = []

    def __init__(self, name, cmd, path, secret, dst, *, pin=True):
        self.name, self.pinned, self.n = name, pin, 0
        dst.mkdir(parents=True)

    def send(self, src, opts):
        FakeSide.calls.append((self.name, src.name))
        self.n += 1
        base = 1.0 if self.name == "A" else 0.9
        return {"wall": base + self.n / 100, "tx_cpu": base / 2, "rx_cpu": base / 4, "agent_seconds": base,
                "bytes": 1, "files": 1}

    def close(self):
        pass


def test_interleave_alternates_the_order_every_round():
    FakeSide.calls = []
    a, b = FakeSide.__new__(FakeSide), FakeSide.__new__(FakeSide)
    a.name, b.name, a.n, b.n = "A", "B", 0, 0
    pairs = ab.interleave([a, b], 4, {"c": (1, 1, [])}, {"c": ab.Path("src")}, log=lambda s: None)
    assert [p["order"] for p in pairs["c"]] == ["AB", "BA", "AB", "BA"]
    assert [n for n, _ in FakeSide.calls] == list("ABBAABBA")
    assert all({"A", "B"} <= set(p) for p in pairs["c"])


def test_summary_is_median_range_and_ratios_per_pair():
    pairs = {"c": [{"round": i, "order": "AB", "A": {"wall": a, "tx_cpu": 1.0, "rx_cpu": 2.0},
                    "B": {"wall": b, "tx_cpu": 0.5, "rx_cpu": 2.0}} for i, (a, b) in enumerate([(1, 2), (3, 3), (2, 6)])]}
    s = ab.summarize_pairs(pairs)["c"]
    assert s["wall"]["A"] == {"unit": "s", "values": [1.0, 3.0, 2.0], "n": 3, "median": 2.0, "min": 1.0, "max": 3.0}
    assert s["wall"]["B/A of medians"] == 3.0 / 2.0
    assert s["wall"]["B/A per pair"]["values"] == [2.0, 1.0, 3.0]
    assert s["tx_cpu"]["B/A per pair"]["median"] == 0.5


def test_main_writes_raw_pairs_and_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(ab, "Side", FakeSide)
    results = tmp_path / "results"
    rc = cli.main(["ab", "--a-cmd", "old/fstream", "--b-cmd", "new/fstream", "--repeat", "3",
                   "--case", "1 x 1 B", "--src-dir", str(tmp_path), "--results", str(results)])
    assert rc == 0
    [jp] = results.glob("ab-*.json")
    [mp] = results.glob("ab-*.md")
    doc = json.loads(jp.read_text())
    prov = doc["provenance"]
    assert prov["bench"] == "ab" and prov["command"].startswith("fstream bench ab --a-cmd old/fstream")
    assert prov["code_hash"].startswith("sha256:") and "load_end" in prov and "fstream_bench.datapath.ab" in prov["modules"]
    assert len(doc["pairs"]["1 x 1 B"]) == 3 and doc["pairs"]["1 x 1 B"][1]["order"] == "BA"
    assert doc["summary"]["1 x 1 B"]["wall"]["A"]["n"] == 3
    assert doc["sides"]["A"]["cmd"] == "old/fstream" and doc["error"] is None
    md = mp.read_text()
    assert "| 1 x 1 B | wall s |" in md and "B/A" in md and prov["commit"][:12] in md


def test_a_failed_send_keeps_the_pairs_before_it(tmp_path, monkeypatch):
    class Failing(FakeSide):
        def send(self, src, opts):
            if self.name == "B" and self.n >= 1:
                raise RuntimeError("B: send failed (2)")
            return super().send(src, opts)
    monkeypatch.setattr(ab, "Side", Failing)
    rc = ab.main(["--a-cmd", "a", "--b-cmd", "b", "--repeat", "4", "--case", "1 x 1 B", "--src-dir", str(tmp_path),
                  "--results", str(tmp_path / "r")])
    doc = json.loads(next((tmp_path / "r").glob("ab-*.json")).read_text())
    assert rc == 1 and "send failed" in doc["error"] and len(doc["pairs"]["1 x 1 B"]) == 1
    assert "Stopped early" in next((tmp_path / "r").glob("ab-*.md")).read_text()


def test_default_cases_are_the_section_7_ones():
    assert ab.DEFAULT_CASES == ("1 x 1 GiB, p=4", "2000 x 256 KiB, cc=4 pp=16")
    assert set(ab.DEFAULT_CASES) < set(ab.CASES)


def test_write_result_refuses_a_result_without_provenance(tmp_path):
    with pytest.raises(ValueError, match="provenance"):
        runstats.write_result(tmp_path, "ab", {"pairs": {}}, "x")


def test_write_result_never_overwrites(tmp_path, monkeypatch):
    monkeypatch.setattr(runstats, "stamp", lambda: "20260101-000000")
    doc = {"provenance": {"bench": "x"}}
    p1, _ = runstats.write_result(tmp_path, "micro", doc, "a")
    p2, m2 = runstats.write_result(tmp_path, "micro", doc, "b")
    assert p1.name == "micro-20260101-000000.json" and p2.name == "micro-20260101-000000-2.json"
    assert m2.read_text() == "b\n" and json.loads(p2.read_text()) == doc
