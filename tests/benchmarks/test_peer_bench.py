"""Rows 16 of ``make bench`` (benchmarks/peer_bench.py) at toy size: TGO and the peer, ``representation-geometry``,
observe the same tiny ViT, and every row is written. Nothing is timed; the errors are checked, because they are what
the rows claim: TGO's float64 observation equals the float64 two-pass reference, the peer's float32 one does not."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from benchmarks import _harness as h
from benchmarks import peer_bench
from benchmarks._table import PEER_ROWS, Table


def test_without_the_peer_its_rows_are_skipped_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(peer_bench, "peer_version", lambda: None)
    table = Table()
    assert peer_bench.peer_rows(table, "smoke", work=tmp_path) == {"skipped": "representation-geometry not installed"}
    assert [r["row"] for r in table.rows] == [*PEER_ROWS, peer_bench.GPU_PEER_ROW]
    assert {r["shown_as"] for r in table.rows} == {"16"}
    assert table.render().count("skipped (representation-geometry not installed)") == 1


def test_side_by_side_rows_at_toy_size(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("representation_geometry", reason="the bench extra (pip install -e '.[bench]') is absent")
    monkeypatch.setattr(h, "MEASURING", False)  # no warm-up, no gc.collect before each timed call
    table = Table()
    raw = peer_bench.peer_rows(table, "smoke", work=tmp_path, gpu=False)
    rows = {r["row"]: r for r in table.rows}
    assert sorted(rows) == sorted(PEER_ROWS)
    assert all(isinstance(r["value"], float) and math.isfinite(r["value"]) for r in rows.values()), rows
    assert raw["points"] == ["block_01", "block_02"]  # the tiny ViT's two block outputs, as the peer hooks them
    errors = raw["errors"]
    assert set(errors) == {"peer", "f64", "f32", "defaults"}
    for name in ("f64", "defaults"):  # float64 Gram: the reference's own precision
        assert max(errors[name].values()) < 1e-12, errors
    assert max(errors["f32"].values()) < 1e-5, errors
    assert 0 < max(errors["peer"].values()) < 1e-3, errors  # the peer's float32 covariance and eigh
    # row 16.10: every timed run of each tool spent time in its own functions, fewer seconds than the whole run
    own, timings = raw["own_work_s"], raw["timings"]
    assert sorted(own) == sorted(["peer", *peer_bench.VARIANTS])
    for name in peer_bench.VARIANTS:
        assert len(own[name]) == len(timings[name]["runs"])
        assert all(0 < o < t for o, t in zip(own[name], timings[name]["runs"], strict=True)), (own, timings)
    assert rows[peer_bench.OWN_WORK_ROW]["value"] > 0  # at toy size the ratio itself says nothing


def test_the_own_work_clock_counts_each_tools_functions_and_restores_them() -> None:
    pytest.importorskip("representation_geometry", reason="the bench extra (pip install -e '.[bench]') is absent")
    from representation_geometry.online import RunningCovariance

    from tgo.spectral.accumulator import StreamingCovariance

    before = (StreamingCovariance.update, RunningCovariance.update)
    rows = torch.randn(64, 8)
    with peer_bench.own_work_clock() as seconds:
        StreamingCovariance(8).update(rows)
        assert seconds["tgo"] > 0 and seconds["peer"] == 0
        RunningCovariance(dim=8).update(rows)
        assert seconds["peer"] > 0
    assert (StreamingCovariance.update, RunningCovariance.update) == before
