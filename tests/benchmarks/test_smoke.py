"""``python -m benchmarks --smoke``: the benchmarks still run against the current API and produce every row.

The benchmarks are not tests and nothing here times anything. What rots silently is the benchmark code itself: it
reaches into library internals (the names ``observe_and_record`` calls, the callback's figure method), so an API
refactor breaks ``make bench`` without failing a single test. This runs the whole benchmark at toy size in a fresh
interpreter, as ``make bench`` would, and checks that ``results.json`` holds every row the table declares. The one
table renderer and the row registry are checked directly.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from benchmarks._table import CURVATURE_ROWS, OPTIMISATION_ROWS, ROWS, SCALE_ROWS, Table, render_columns

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600  # a hang fails the test instead of blocking the suite; a normal smoke run takes well under a minute


def run_smoke(out: Path) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks --smoke --out OUT`` in a fresh interpreter from the repository root."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def is_measured(row: dict[str, Any]) -> bool:
    """A finite number (not a bool) as the row's value."""
    value = row.get("value")
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_skipped(row: dict[str, Any]) -> bool:
    """No value, and a non-empty reason why."""
    return row.get("value") is None and isinstance(row.get("skipped"), str) and bool(row["skipped"].strip())


@pytest.mark.slow  # ~55 s of CPU on 2 cores: interpreter starts (torch, timm, Lightning; rows 17's two CLI fits are
# 16 s of it), matplotlib figures and rows 11's two tiny fits and 2-process gloo run (~15 s: each spawned rank imports
# torch and timm)
def test_smoke_run_produces_every_declared_row(tmp_path: Path) -> None:
    proc = run_smoke(tmp_path)
    assert proc.returncode == 0, f"benchmarks --smoke failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"

    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert results["mode"] == "smoke"
    assert results["failures"] == []
    assert results["spectral_bench"]["returncode"] == 0, results["spectral_bench"]["output"][-2000:]

    rows = {row["row"]: row for row in results["table"]}
    assert len(rows) == len(results["table"]), "a row was written twice"
    assert sorted(rows) == sorted(ROWS), "results.json rows differ from benchmarks._table.ROWS"
    bad = {name: row for name, row in rows.items() if not (is_measured(row) or is_skipped(row))}
    assert not bad, f"rows with neither a finite value nor a skip reason: {bad}"
    assert (tmp_path / "table.txt").is_file() and (tmp_path / "spectral_bench.txt").is_file()
    # rows 11 (benchmarks/scale_bench.py): a real fit with the callback and a 2-process gloo run; W = 3 is left out
    assert [name for name in SCALE_ROWS if not is_measured(rows[name])] == ["11.4"], {n: rows[n] for n in SCALE_ROWS}
    # rows 12 (optimisation_bench.py: two tiny fits per variant) and 13 (curvature_bench.py: HVPs and FLOP counts)
    assert all(is_measured(rows[name]) for name in (*OPTIMISATION_ROWS, *CURVATURE_ROWS)), rows


def test_columns_are_aligned_with_a_free_last_column() -> None:
    text = render_columns(("name", "n", "note"), [("a", 1, "x"), None, ("bbb", 22, "")], right={1})
    assert text.splitlines() == ["name   n  note", "-" * 54, "a      1  x", "", "bbb   22"]
    assert render_columns(("a", "b"), [(1, 2)], right={1}, rule=False) == "a  b\n1  2"


def test_the_table_knows_every_declared_row_and_renders_them_in_order() -> None:
    table = Table()
    table.add("2.1", "second", 2.0, "x")
    table.add("1a.0", "first", 0.5, "s", "detail")
    table.skip(["6.0", "6.2"], "GPU rows", "no GPU", shown_as="6")
    table.add("zz", "undeclared", 1.0)
    lines = table.render().splitlines()
    assert [line.split()[0] for line in lines if line and not line.startswith("-")] == ["row", "1a.0", "2.1", "6", "zz"]
    assert "0.500 s" in lines[2] and "skipped (no GPU)" in table.render()
    problems = table.problems()
    assert "row zz is not declared in ROWS" in problems
    assert "row 1b.0 missing (neither measured nor skipped)" in problems


def test_within_one_fit_an_observation_is_priced_against_the_epochs_it_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row 17.8's within-fit estimate (`within_fit`, `clocked`), on a fit made up from known parts: epochs of 10 s; each
    observation's pass adds 2 s to the epoch it ends, its background summary 5 s to the epoch after; epoch 0 pays 12 s
    once. The clean epochs are 10 s, and one observation costs 7 s: 14 % of five epochs; the summaries' durations (the
    CSV logger's ``geometry/summary_seconds``) pick the clean epochs, and a summary too long leaves none."""
    from benchmarks.callback_cost_bench import (
        CLOCK_FILE,
        clocked,
        epoch_clock_overrides,
        steady_value,
        within_fit,
        within_text,
    )
    from benchmarks.epoch_clock import EpochClock

    t0, epochs = 1_796_520_000.0, 20
    length = {e: 10.0 for e in range(epochs)}
    length[0] += 12.0
    observed_after = [5, 10, 15, 20]
    for k in observed_after:
        length[k - 1] += 2.0  # the pass of observation k ends epoch k - 1
        if k < epochs:
            length[k] += 5.0  # its summary, in the background of the next epoch
    starts = [t0 + sum(length[e] for e in range(i)) for i in range(epochs)]
    end = starts[-1] + length[epochs - 1]
    observed = {k: starts[k - 1] + length[k - 1] for k in observed_after}
    # the summaries' durations (the CSV logger's geometry/summary_seconds) pick the clean epochs: those before the
    # next pass that start after the summary ended (here from k + 1 on); a summary that outlasts all four leaves its
    # cycle none, and such a cycle is counted
    known = within_fit(starts, end, observed, [6.0] * 4)
    assert known["epoch"] == pytest.approx(10.0) and known["per_observation"] == pytest.approx(7.0)
    assert known["percent"] == pytest.approx(14.0) and len(known["cycles"]) == 3
    assert len(known["clean"]) == 9 and known["dirty"] == 0 and "14.0 %" in within_text(known, epochs)
    mixed = within_fit(starts, end, observed, [6.0, 60.0, 6.0, 6.0])
    assert mixed["percent"] == pytest.approx(14.0) and mixed["dirty"] == 1
    assert "1 without a clean" in within_text(mixed, epochs)
    slow = within_fit(starts, end, observed, [60.0] * 4)
    assert slow["dirty"] == 3 and math.isnan(slow["percent"]) and "not resolved" in within_text(slow, epochs)
    with pytest.raises(ValueError, match="3 summary durations for 4 observations"):
        within_fit(starts, end, observed, [6.0] * 3)
    # the row shows the within-fit estimate where it resolved, else the estimate across fits with its verdict
    assert steady_value(known, 28.0, 24.8) == (pytest.approx(14.0), "met", "within")
    assert steady_value(slow, 28.0, 24.8) == (28.0, "MISSED", "across")
    assert steady_value(slow, -7.2, 3.0)[1].startswith("not resolved")

    # row 17.8 as the bench writes it, its fits replaced by these made-up parts (10 and 20 epochs)
    import benchmarks.callback_cost_bench as bench

    made_up = {
        ("without", 10): {"wall_s": 100.0, "cpu_s": 180.0},
        ("with", 10): {"wall_s": 121.0, "cpu_s": 213.0},
        ("without", 20): {"wall_s": 200.0, "cpu_s": 360.0},
        ("with", 20): {"wall_s": 239.0, "cpu_s": 415.0},
    }

    def fake_fit(overrides: list[str], run: Path) -> dict[str, float]:
        epochs = int(next(o for o in overrides if o.startswith("trainer.max_epochs=")).split("=")[1])
        return made_up[("without" if "callbacks.spectral_geometry=null" in overrides else "with", epochs)]

    monkeypatch.setattr(bench, "fit", fake_fit)
    monkeypatch.setattr(bench, "clocked", lambda run: known)
    table = Table()
    short = {"without, CSV": made_up[("without", 10)], "CSV": made_up[("with", 10)]}
    bench.steady_state_row(table, bench.VIT_SMALL_64, "17.8", "default", short, tmp_path)
    (row,) = table.rows
    assert row["value"] == pytest.approx(14.0) and row["detail"].startswith("within the 20-epoch fit: 14.0 %")
    assert "target <= 15 % met; across fits (10 and 20 epochs, 2 observations added): 18.0 %" in row["detail"]

    # the same from the files a fit leaves: the clock's JSON (rank 0 writes it) and train.log's lines in local time
    rank0, other = (type("Trainer", (), {"is_global_zero": zero})() for zero in (True, False))
    EpochClock(str(tmp_path / "other.json")).on_train_end(other, None)
    ticks = iter([*starts, end])
    monkeypatch.setattr("benchmarks.epoch_clock.time", types.SimpleNamespace(time=lambda: next(ticks)))
    clock = EpochClock(str(tmp_path / CLOCK_FILE))
    for _ in starts:
        clock.on_train_epoch_start(rank0, None)
    clock.on_train_end(rank0, None)
    assert not (tmp_path / "other.json").exists()
    lines = [
        f"[{datetime.datetime.fromtimestamp(t):%Y-%m-%d %H:%M:%S},{round(t % 1 * 1000):03d}][lightning][INFO] - "
        f"[tgo] geometry of epoch {k} streamed and reduced over 200 images in 1.50 s; summary in the background"
        for k, t in observed.items()
    ]
    (tmp_path / "train.log").write_text(
        "[2026-12-06 02:01:50,388][seed][INFO] - Seed set\n" + "\n".join(lines), encoding="utf-8"
    )
    (tmp_path / "csv").mkdir()
    rows = "".join(
        f"{k},,{8 * k}\n{k},{seconds},{8 * k}\n" for k, seconds in zip(observed_after, [6, 60, 6, 6], strict=True)
    )
    (tmp_path / "csv" / "metrics.csv").write_text("epoch,geometry/summary_seconds,step\n" + rows, encoding="utf-8")
    from_files = clocked(tmp_path)
    assert from_files["dirty"] == 1
    assert from_files["percent"] == pytest.approx(14.0, abs=1e-3)
    assert epoch_clock_overrides(tmp_path)[1] == f"+callbacks.epoch_clock.path={tmp_path / CLOCK_FILE}"
    assert not list(tmp_path.glob("*.partial"))


def test_the_steady_state_cost_prices_one_observation_apart_from_what_a_fit_pays_once() -> None:
    """Rows 17.7-17.8 (`steady_state`), on fits made up from known parts: epochs of 10 s (18 s CPU), each
    observation 6 s (11 s CPU), 4 s (7 s CPU) once per fit; at 10 and 20 epochs (3 and 5 observations)."""
    from benchmarks.callback_cost_bench import EVERY_N_EPOCHS, observations_in, run_dir, steady_state, steady_verdict

    assert run_dir(Path("w"), "quickstart_without, CSV_long").name == "quickstart_without_CSV_long"  # Hydra's comma

    def fits(epochs: int) -> dict[str, dict[str, float]]:
        n = observations_in(epochs)
        return {
            "without, CSV": {"wall_s": 10.0 * epochs, "cpu_s": 18.0 * epochs},
            "CSV": {"wall_s": 10.0 * epochs + 6.0 * n + 4.0, "cpu_s": 18.0 * epochs + 11.0 * n + 7.0},
        }

    assert (observations_in(10), observations_in(20), observations_in(7)) == (3, 5, 3)
    got = steady_state(fits(10), fits(20), 10)
    assert got["observations_added"] == 2
    for clock, (per, epoch, once) in {"wall_s": (6.0, 10.0, 4.0), "cpu_s": (11.0, 18.0, 7.0)}.items():
        assert got[clock]["per_observation"] == pytest.approx(per)
        assert got[clock]["epoch"] == pytest.approx(epoch)
        assert got[clock]["once"] == pytest.approx(once)
        assert got[clock]["percent"] == pytest.approx(100 * per / (EVERY_N_EPOCHS * epoch))
    assert (steady_verdict(12.0, 14.9), steady_verdict(18.9, 16.1)) == ("met", "MISSED")
    assert steady_verdict(-7.2, -6.9).startswith("not resolved")
