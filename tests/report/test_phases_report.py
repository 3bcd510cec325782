"""The report's "Training phases" section on a synthetic record with known phases (written through `tgo.records`)."""

from __future__ import annotations

import html
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tgo.records import RecordWriter
from tgo.report import build_report
from tgo.report.context import judge
from tgo.report.html import render_page
from tgo.report.phases import phases_section, run_phases
from tgo.report.runs import load_run_data
from tgo.spectral.phases import COLLAPSE, COMPRESSION, ENTROPY, UNRESOLVED, PhaseRule

G = 5
EPOCHS = [0, 1, 2, 4, 6, 8, 10]
# Per point: effective rank and alpha at EPOCHS. block_01: a collapse, entropy-seeking twice, compression-seeking
# three times. block_02: flat (unresolved throughout). cls: entropy-seeking, then a contradiction (both rise).
TRUTH = {
    "block_01": (
        [40.0, 12.0, 15.0, 18.0, 16.0, 14.0, 12.5],
        [0.4, 1.6, 1.4, 1.2, 1.3, 1.4, 1.5],
        [(COLLAPSE, 0, 1), (ENTROPY, 1, 4), (COMPRESSION, 4, 10)],
    ),
    "block_02": ([20.0] * 7, [1.0] * 7, [(UNRESOLVED, 0, 10)]),
    "cls": (
        [5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0],
        [1.0, 0.9, 0.8, 0.7, 0.8, 0.9, 1.0],
        [(ENTROPY, 0, 4), (UNRESOLVED, 4, 10)],
    ),
}


def _write_run(run: Path) -> None:
    """Values with replicates whose per-group pattern is shared by every epoch (the same images) plus 1e-3 noise:
    the paired errors are ~1e-3, so every move of 0.1 is far outside the noise and a flat series is inside it."""
    rng = np.random.default_rng(0)
    pattern = rng.standard_normal(G)
    writer = RecordWriter(run)
    for i, epoch in enumerate(EPOCHS):
        results = {}
        for point, (rank, alpha, _) in TRUTH.items():
            reps = {
                m: v + 0.1 * pattern + 1e-3 * rng.standard_normal(G)
                for m, v in (("effective_rank", rank[i]), ("power_law_alpha", alpha[i]))
            }
            eigs = np.array([3.0, 2.0, 1.0, 0.5])
            results[point] = SimpleNamespace(
                spectrum=SimpleNamespace(eigenvalues=eigs, n_rows=100, n_nonfinite=0),
                mean=np.zeros(4),
                covariance=np.diag(eigs),
                observables={"effective_rank": rank[i], "power_law_alpha": alpha[i]},
                stderr={m: 0.1 for m in reps},
                jackknife=reps,
                kept_arrays={},
                arrays={},
            )
        writer.write_observation(epoch, 10 * epoch, results, with_covariance=False)


def test_the_section_holds_the_merged_phases_of_a_synthetic_record(tmp_path):
    run = tmp_path / "run"
    _write_run(run)
    data = load_run_data(run, "run")
    points = {p.point: p for p in run_phases(data, PhaseRule())}
    for point, (_, _, phases) in TRUTH.items():
        assert [(ph.label, ph.start_epoch, ph.end_epoch) for ph in points[point].phases] == phases, point
    assert "contradictory" in points["cls"].labels[-1].reason

    (section,) = phases_section(judge([data], figures_dir=tmp_path / "figures"))
    assert section.anchor == "phases"
    assert (tmp_path / section.figures[0].path).is_file()
    rows = section.tables[0].rows
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (point, label, f"{a}-{b}") for point, (_, _, phases) in TRUTH.items() for label, a, b in phases
    ]
    page = html.unescape(render_page("t", [section], tmp_path))
    assert "Training phases" in page and "collapse" in page and "at least 50%" in page


def test_the_report_page_has_the_section(tmp_path):
    run = tmp_path / "run"
    _write_run(run)
    index = build_report([run], out=tmp_path / "report", correlation=False)
    page = html.unescape(index.read_text(encoding="utf-8"))
    assert 'id="phases"' in page and "compression-seeking" in page
    assert (tmp_path / "report" / "figures" / "phases_run.png").is_file()
