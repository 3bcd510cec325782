"""``python -m tgo.report``: the page from a real smoke run, several runs, the TGO-I overlay, and bad input."""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.report.synthetic import write_synthetic_run
from tgo.records import RunDir
from tgo.report.__main__ import main
from tgo.report.aggregate import SubsetMismatchError, aggregate_runs, verdict_agreement
from tgo.report.build import build_report
from tgo.report.figures import observable_figures
from tgo.report.findings import evaluate_findings
from tgo.report.reference import (
    PAPER_POINTS,
    REFERENCE_OBSERVABLES,
    compare_with_reference,
    is_tgo1_like,
    load_reference,
    paper_point_name,
)
from tgo.report.runs import ReportInputError, discover_runs, load_run_data
from tgo.spectral.catalogue import CATALOGUE

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EPOCHS = np.arange(0, 11)


def referenced_images(index: Path) -> list[Path]:
    sources = re.findall(r'<img src="([^"]+)"', index.read_text())
    return [index.parent / s for s in sources]


def test_report_of_the_smoke_run(smoke_run: Path, capsys: pytest.CaptureFixture[str]):
    assert main([str(smoke_run)]) == 0
    index = RunDir(smoke_run).report / "index.html"
    assert index.is_file() and str(index.resolve()) in capsys.readouterr().out
    html = index.read_text()
    images = referenced_images(index)
    assert len(images) >= 20
    for image in images:  # every referenced figure exists and is a non-empty PNG
        assert image.is_file() and image.stat().st_size > 1000 and image.read_bytes()[:8] == PNG_MAGIC, image
    kinds = {p.stem.split("_")[0] for p in images}
    assert {"lines", "layer", "eigenvalues", "singular", "decay", "correlation"} <= kinds
    assert "Findings" in html and "effective rank rises" in html and "verdict" in html
    assert "http://" not in html and "https://" not in html  # nothing to fetch: opens offline
    assert "published TGO-I" not in html  # 7 points, not the paper's 15: no overlay by default
    with open(RunDir(smoke_run).report / "findings.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["point"] for r in rows} >= {"patch_embed", "block_04", "cls"}
    assert {r["verdict"] for r in rows} <= {"holds", "holds then reverses", "does not hold", "n/a"}


def two_seeds(root: Path, fingerprints: tuple[str | None, str | None] = ("same", "same")) -> list[Path]:
    curves = [
        {
            "effective_rank": {"block_01": lambda e: 2.0 + e, "cls": lambda e: 3.0 + e},
            "spectral_anisotropy": {"block_01": lambda e: 1.0 - 0.05 * e, "cls": lambda e: 0.9 - 0.05 * e},
        },
        {
            "effective_rank": {
                "block_01": lambda e: 4.0 + e - 0.3 * np.maximum(e - 5, 0) ** 2,  # peaks, falls back
                "cls": lambda e: 5.0 + e,
            },
            "spectral_anisotropy": {"block_01": lambda e: 1.0 - 0.03 * e, "cls": lambda e: 0.9 - 0.03 * e},
        },
    ]
    return [
        write_synthetic_run(root / "sweep" / str(i), c, epochs=EPOCHS, fingerprint=f)
        for i, (c, f) in enumerate(zip(curves, fingerprints, strict=False))
    ]


def test_several_runs_give_mean_and_std_bands_and_agreement_counts(tmp_path: Path):
    runs = [load_run_data(p) for p in two_seeds(tmp_path)]
    agg = aggregate_runs(runs)
    epochs, mean = agg.mean["effective_rank"]["cls"]
    np.testing.assert_array_equal(epochs, EPOCHS)
    np.testing.assert_allclose(mean, 4.0 + EPOCHS)
    np.testing.assert_allclose(agg.high["effective_rank"]["cls"] - mean, np.std([0, 2], ddof=1))  # ±1 std
    counts = verdict_agreement([evaluate_findings(r.series, r.points) for r in runs])
    assert counts[("rank_rises", "effective_rank", "block_01")]["holds"] == 1
    assert counts[("rank_rises", "effective_rank", "block_01")]["holds then reverses"] == 1
    assert counts[("rank_rises", "effective_rank", "cls")]["holds"] == 2


def test_a_sweep_directory_is_searched_for_runs_and_reported_together(tmp_path: Path):
    two_seeds(tmp_path)
    (tmp_path / "sweep" / "multirun.yaml").write_text("{}\n")
    assert [p.name for p in discover_runs([tmp_path / "sweep"])] == ["0", "1"]
    index = build_report([tmp_path / "sweep"], correlation=False)
    assert index == tmp_path / "sweep" / "report" / "index.html"
    html = index.read_text()
    assert "runs agreeing (of 2)" in html and "holds 1/2, holds then reverses 1/2" in html
    assert "mean ± 1 standard deviation" in html
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in referenced_images(index))


def test_runs_with_different_analysis_subsets_are_refused_unless_allowed(tmp_path: Path):
    two_seeds(tmp_path, fingerprints=("aaaa", "bbbb"))
    with pytest.raises(SubsetMismatchError, match="different analysis subsets"):
        build_report([tmp_path / "sweep"], correlation=False)
    index = build_report([tmp_path / "sweep"], correlation=False, allow_different_subsets=True)
    assert "compared on request" in index.read_text()


def test_reference_names_map_onto_our_points():
    assert paper_point_name("Layer_00_PatchEmbed") == "patch_embed"
    assert paper_point_name("Layer_00_PosEmbed") == "pos_embed"
    assert paper_point_name("Layer_07_Block07") == "block_07"
    assert paper_point_name("Layer_13_CLS_Final") == "cls"
    paper = load_reference()
    assert (
        set(paper)
        == set(REFERENCE_OBSERVABLES)
        == {
            "effective_rank",
            "stable_rank",
            "participation_ratio",
            "spectral_entropy",
            "spectral_flatness",
            "spectral_anisotropy",
        }
    )
    assert list(paper["effective_rank"]) == list(PAPER_POINTS)
    epochs, values = paper["effective_rank"]["block_11"]
    np.testing.assert_array_equal(epochs, np.arange(1, 101))
    assert values[0] == pytest.approx(10.52539305961836)
    assert is_tgo1_like(PAPER_POINTS) and not is_tgo1_like(PAPER_POINTS[:-1])


def test_comparison_with_the_paper_uses_the_same_epoch_or_the_papers_last():
    paper = load_reference()
    ours = {
        "effective_rank": {
            "cls": (np.array([0, 5]), np.array([1.0, 2.0])),
            "block_99": (np.array([0, 5]), np.array([1.0, 2.0])),
        }
    }
    (row,) = compare_with_reference(ours, paper, ["cls", "block_99"])
    assert (row.point, row.epoch, row.paper_epoch) == ("cls", 5, 5)
    assert row.ratio == pytest.approx(2.0 / paper["effective_rank"]["cls"][1][4])
    late = {"effective_rank": {"cls": (np.array([300]), np.array([1.0]))}}
    assert compare_with_reference(late, paper, ["cls"])[0].paper_epoch == 100


def test_a_tgo1_like_run_gets_the_overlay_by_default(tmp_path: Path):
    curves = {"effective_rank": {p: (lambda e, i=i: 2.0 + i + e) for i, p in enumerate(PAPER_POINTS)}}
    run = write_synthetic_run(tmp_path / "tgo1", curves, epochs=[1, 2, 3], dim=2)
    html = build_report([run], correlation=False).read_text()
    assert "Comparison with the published TGO-I measurements" in html
    assert "dashed = published TGO-I measurements" in html and "verdict on TGO-I data" in html
    assert "Comparison with" not in build_report([run], reference="none", correlation=False).read_text()


def test_bad_inputs_are_one_line_errors_with_status_2(
    tmp_path: Path, smoke_run: Path, capsys: pytest.CaptureFixture[str]
):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 2
    assert "tgo.report: error:" in capsys.readouterr().err
    smoke = RunDir(smoke_run)
    no_records = RunDir(tmp_path / "no_records")
    no_records.root.mkdir()
    shutil.copy(smoke.config, no_records.config)
    with pytest.raises(ReportInputError, match="without geometry records"):
        build_report([no_records.root])
    with pytest.raises(ReportInputError, match="no such directory"):
        build_report([tmp_path / "missing"])
    a, b = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    shutil.copytree(smoke.geometry, a.geometry)
    shutil.copytree(smoke.geometry, b.geometry)
    shutil.copy(smoke.manifest, a.manifest)
    b.manifest.write_text('{"fingerprint": "0000"}')
    assert main([str(a.root), str(b.root), "--out", str(tmp_path / "r"), "--no-correlation"]) == 2
    assert "fingerprints differ" in capsys.readouterr().err


def test_every_reference_observable_is_a_catalogue_observable():
    """The paper's file and TGO share names and conventions; a renamed catalogue entry must not orphan the overlay."""
    assert set(REFERENCE_OBSERVABLES) <= set(CATALOGUE.names)
    assert set(load_reference()) <= set(CATALOGUE.names)


def test_the_report_reads_view_all_only(tmp_path: Path):
    run = write_synthetic_run(
        tmp_path / "run", {"effective_rank": {"cls": lambda e: 1.0 + e}}, epochs=EPOCHS, other_view="cls_token"
    )
    data = load_run_data(run)
    assert data.points == ["cls"] and data.epochs == EPOCHS.tolist()
    epochs, values = data.series["effective_rank"]["cls"]
    np.testing.assert_array_equal(epochs, EPOCHS)
    np.testing.assert_array_equal(values, 1.0 + EPOCHS)  # not the other view's negated values
    assert set(data.spectra()[0]) == {"cls"}


def test_runs_inside_the_directories_a_run_never_nests_are_not_found(tmp_path: Path):
    outer = two_seeds(tmp_path)[0]
    for sub in RunDir.NON_RUN_SUBDIRS:  # e.g. a copy of a run under a previous report's output
        write_synthetic_run(
            outer.parent / "skipped" / sub / "copy", {"effective_rank": {"cls": lambda e: e}}, epochs=[0, 1]
        )
    assert [p.name for p in discover_runs([tmp_path / "sweep"])] == ["0", "1"]


def test_malformed_records_are_report_input_errors_with_the_records_message(tmp_path: Path):
    run = RunDir(write_synthetic_run(tmp_path / "run", {"effective_rank": {"cls": lambda e: 1.0 + e}}, epochs=[0, 1]))
    text = run.metrics.read_text().splitlines()
    run.metrics.write_text("\n".join([*text, "x,0,cls,all,effective_rank,1.0"]) + "\n")
    with pytest.raises(ReportInputError, match="malformed row"):
        load_run_data(run.root)
    run.metrics.write_text("a,b\n")
    with pytest.raises(ReportInputError, match="header"):
        load_run_data(run.root)
    run.metrics.unlink()
    with pytest.raises(ReportInputError, match=r"metrics.csv is missing"):
        load_run_data(run.root)


def test_figures_draw_the_catalogues_charted_observables(tmp_path: Path):
    uncharted = next(o.name for o in CATALOGUE if not o.charted)
    curves = {metric: {"cls": lambda e: 1.0 + e} for metric in (*CATALOGUE.charted, uncharted)}
    agg = aggregate_runs([load_run_data(write_synthetic_run(tmp_path / "run", curves, epochs=[0, 1, 2]))])
    drawn = [
        Path(f.path).stem.removeprefix("lines_")
        for f in observable_figures(agg, tmp_path / "figures")
        if f.section == "observables"
    ]
    assert drawn == list(CATALOGUE.charted)
