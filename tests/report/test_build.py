"""``python -m tgo.report``: the page from a real smoke run, several runs, the TGO-I overlay, and bad input."""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.report.pngs import PNG_MAGIC, rasterise_no_figures
from tests.report.synthetic import write_synthetic_run
from tgo.records import RunDir
from tgo.report.__main__ import main
from tgo.report.aggregate import SubsetMismatchError, aggregate_runs
from tgo.report.build import build_report
from tgo.report.figures import observable_figures
from tgo.report.findings import VERDICTS, evaluate_findings
from tgo.report.reference import (
    PAPER_POINTS,
    REFERENCE_OBSERVABLES,
    compare_with_reference,
    is_tgo1_like,
    load_reference,
    paper_point_name,
)
from tgo.report.runs import ReportInputError, discover_runs, load_run_data
from tgo.report.statements import count_agreement
from tgo.spectral.catalogue import CATALOGUE

EPOCHS = np.arange(0, 11)
REQUIRED_COLUMNS = (
    "claim",
    "metric",
    "point",
    "verdict",
    "first",
    "last",
    "change",
    "uncertainty",
    "peak_epoch",
    "note",
)
CLAIM_KEYS = {
    "rank_rises",
    "anisotropy_falls",
    "entropy_rises",
    "covariance_diagonalizes",
    "spectra_flatten",
    "embeddings_stable",
    "cls_extreme",
}


def referenced_images(index: Path) -> list[Path]:
    sources = re.findall(r'<img src="([^"]+)"', index.read_text(encoding="utf-8"))
    return [index.parent / s for s in sources]


def test_report_of_the_smoke_run(smoke_run: Path, capsys: pytest.CaptureFixture[str]):
    assert main([str(smoke_run)]) == 0
    index = RunDir(smoke_run).report / "index.html"
    assert index.is_file() and str(index.resolve()) in capsys.readouterr().out
    html = index.read_text(encoding="utf-8")
    images = referenced_images(index)
    assert len(images) >= 20
    for image in images:  # every referenced figure exists and is a non-empty PNG
        assert image.is_file() and image.stat().st_size > 1000 and image.read_bytes()[:8] == PNG_MAGIC, image
    kinds = {p.stem.split("_")[0] for p in images}
    assert {"story", "lines", "layer", "eigenvalues", "singular", "decay", "correlation", "optimisation"} <= kinds
    assert 'id="optimisation"' in html and "Optimisation geometry" in html  # the weights family's spectra
    assert "Findings" in html and "effective rank rises" in html and "verdict" in html
    assert "http://" not in html and "https://" not in html  # nothing to fetch: opens offline
    assert "published TGO-I" not in html  # the overlay is opt-in (--reference tgo1)
    assert "At a glance" in html and "Observables against depth" in html
    with open(RunDir(smoke_run).report / "findings.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["point"] for r in rows} >= {"patch_embed", "block_04", "cls"}
    assert {r["verdict"] for r in rows} <= set(VERDICTS)
    assert set(REQUIRED_COLUMNS) <= set(rows[0])


def two_seeds(root: Path, fingerprints: tuple[str | None, str | None] = ("same", "same")) -> list[Path]:
    curves = [
        {
            "effective_rank": {"block_01": lambda e: 2.0 + e, "cls": lambda e: 3.0 + e},
            "spectral_anisotropy": {"block_01": lambda e: 1.0 - 0.05 * e, "cls": lambda e: 0.9 - 0.05 * e},
        },
        {
            "effective_rank": {
                # peaks, then falls below its start (a dip alone reads no reversal without training noise)
                "block_01": lambda e: 4.0 + e - 0.6 * np.maximum(e - 5, 0) ** 2,
                "cls": lambda e: 5.0 + e,
            },
            "spectral_anisotropy": {"block_01": lambda e: 1.0 - 0.03 * e, "cls": lambda e: 0.9 - 0.03 * e},
        },
    ]

    def errors(c: dict) -> dict:  # a small jackknife standard error everywhere, as every run since the jackknife has
        return {metric: dict.fromkeys(per_point, lambda e: 0.0 * e + 0.05) for metric, per_point in c.items()}

    return [
        write_synthetic_run(root / "sweep" / str(i), c, epochs=EPOCHS, fingerprint=f, stderr=errors(c))
        for i, (c, f) in enumerate(zip(curves, fingerprints, strict=False))
    ]


def test_several_runs_give_mean_and_std_bands_and_agreement_counts(tmp_path: Path):
    runs = [load_run_data(p) for p in two_seeds(tmp_path)]
    agg = aggregate_runs(runs)
    epochs, mean = agg.mean["effective_rank"]["cls"]
    np.testing.assert_array_equal(epochs, EPOCHS)
    np.testing.assert_allclose(mean, 4.0 + EPOCHS)
    np.testing.assert_allclose(agg.high["effective_rank"]["cls"] - mean, np.std([0, 2], ddof=1))  # ±1 std
    counts = count_agreement([evaluate_findings(r.series, r.points, stderr=r.stderr) for r in runs], VERDICTS)
    assert counts[("rank_rises", "effective_rank", "block_01")]["holds"] == 1
    assert counts[("rank_rises", "effective_rank", "block_01")]["does not hold"] == 1
    assert counts[("rank_rises", "effective_rank", "cls")]["holds"] == 2


def test_a_sweep_directory_is_searched_for_runs_and_reported_together(tmp_path: Path):
    two_seeds(tmp_path)
    (tmp_path / "sweep" / "multirun.yaml").write_text("{}\n", encoding="utf-8")
    assert [p.name for p in discover_runs([tmp_path / "sweep"])] == ["0", "1"]
    index = build_report([tmp_path / "sweep"], correlation=False)
    assert index == tmp_path / "sweep" / "report" / "index.html"
    html = index.read_text(encoding="utf-8")
    assert "runs agreeing (of 2)" in html and "holds 1/2, does not hold 1/2" in html
    assert "mean ± 1 standard deviation" in html
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in referenced_images(index))


def test_runs_with_different_analysis_subsets_are_refused_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    rasterise_no_figures(monkeypatch)  # the same sweep's PNGs: test_a_sweep_directory_is_searched_for_runs_and_...
    two_seeds(tmp_path, fingerprints=("aaaa", "bbbb"))
    with pytest.raises(SubsetMismatchError, match="different analysis subsets"):
        build_report([tmp_path / "sweep"], correlation=False)
    index = build_report([tmp_path / "sweep"], correlation=False, allow_different_subsets=True)
    assert "compared on request" in index.read_text(encoding="utf-8")


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
    b.manifest.write_text('{"fingerprint": "0000"}', encoding="utf-8")
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
    text = run.metrics.read_text(encoding="utf-8").splitlines()
    run.metrics.write_text("\n".join([*text, "x,0,cls,all,effective_rank,1.0"]) + "\n", encoding="utf-8")
    with pytest.raises(ReportInputError, match="malformed row"):
        load_run_data(run.root)
    run.metrics.write_text("a,b\n", encoding="utf-8")
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


def read_findings(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_published_writes_the_findings_of_the_shipped_measurements_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["--published", "--out", str(tmp_path / "paper")]) == 0
    rows = read_findings(tmp_path / "paper" / "findings.csv")
    assert list(rows[0])[:1] == ["claim"] and set(REQUIRED_COLUMNS) <= set(rows[0])
    assert {r["claim"] for r in rows} == CLAIM_KEYS - {"covariance_diagonalizes"}  # the paper has no off-diagonal data
    assert len(rows) == 107
    reversals = {(r["metric"], r["point"]) for r in rows if r["verdict"] == "holds then reverses"}
    assert {p for _, p in reversals} == {"block_09", "block_10", "block_11", "block_12"} and len(reversals) == 12
    for row in rows:
        if row["verdict"] in ("holds", "holds then reverses", "does not hold", "inconclusive"):
            assert float(row["uncertainty"]) > 0 and row["peak_epoch"].isdigit(), row
    cls = next(r for r in rows if r["claim"] == "cls_extreme")
    assert (cls["rank"], cls["of"]) == ("1", "15") and "cls ranks 1 of 15" in cls["note"]
    html = (tmp_path / "paper" / "index.html").read_text(encoding="utf-8")
    assert "published TGO-I measurements" in html and "inconclusive" in html
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in referenced_images(tmp_path / "paper" / "index.html"))


def test_published_is_refused_with_runs_or_without_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["--published"]) == 2
    assert "--published needs --out" in capsys.readouterr().err
    assert main(["--published", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "--reference tgo1" in capsys.readouterr().err
    assert main([]) == 2


def test_the_old_tolerance_option_says_what_replaced_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["--published", "--out", str(tmp_path), "--tolerance", "0.02"]) == 2
    assert "--window" in capsys.readouterr().err
    assert main(["--published", "--out", str(tmp_path), "--z", "0"]) == 2
    assert "z must be > 0" in capsys.readouterr().err


def test_window_and_z_options_reach_the_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    rasterise_no_figures(monkeypatch)  # findings.csv is read here; test_published_writes_... checks the PNGs
    assert main(["--published", "--out", str(tmp_path / "a"), "--window", "0.2", "--z", "1000"]) == 0
    rows = read_findings(tmp_path / "a" / "findings.csv")
    assert {r["window"] for r in rows if r["window"]} == {"20"}
    assert {r["verdict"] for r in rows} <= {"inconclusive", "n/a"}


def test_a_run_with_standard_errors_shows_them_as_bands_and_in_the_table(tmp_path: Path):
    curves = {"effective_rank": {"block_01": lambda e: 2.0 + 0.1 * e, "cls": lambda e: 3.0 + e}}
    errors = {"effective_rank": {"block_01": lambda e: 0.0 * e + 0.5, "cls": lambda e: 0.0 * e + 0.01}}
    run = write_synthetic_run(tmp_path / "run", curves, epochs=EPOCHS, stderr=errors)
    index = build_report([run], correlation=False)
    html = index.read_text(encoding="utf-8")
    assert "band = value ± 1 jackknife standard error" in html
    rows = {(r["claim"], r["point"]): r for r in read_findings(index.parent / "findings.csv")}
    block = rows[("rank_rises", "block_01")]
    assert block["verdict"] == "inconclusive" and block["uncertainty_source"] == "jackknife"
    assert float(block["uncertainty"]) == pytest.approx(0.5 * np.sqrt(2))
    assert f"+0.9 ± {float(block['uncertainty']):.2g}" in html  # change of the window means ± standard error
    assert rows[("rank_rises", "cls")]["verdict"] == "holds"


def test_a_run_without_standard_errors_has_no_bands(tmp_path: Path):
    run = write_synthetic_run(tmp_path / "run", {"effective_rank": {"cls": lambda e: 1.0 + e}}, epochs=EPOCHS)
    assert (
        "jackknife standard error"
        not in build_report([run], correlation=False).read_text(encoding="utf-8").split("<h2")[-1]
    )


def test_a_sweeps_mean_carries_the_mean_of_its_runs_replicates_so_its_contrasts_stay_paired(tmp_path: Path):
    """The leave-one-group-out value of a mean over runs (same images, same groups) is the mean of the runs'
    leave-one-group-out values; runs without replicates, or with another G, leave the mean without them."""
    from tgo.report.runs import RunData

    epochs = np.array([0, 5, 10])
    rng = np.random.default_rng(0)

    def run(name: str, groups: int) -> RunData:
        values = 1.0 + epochs / 10 + rng.standard_normal(3) * 0.01
        leave_out = values[:, None] + rng.standard_normal((3, groups)) * 0.01
        series = {"effective_rank": {"block_01": (epochs, values)}}
        return RunData(
            tmp_path / name, name, series, ["block_01"], list(epochs), "same",
            {"effective_rank": {"block_01": (epochs, np.full(3, 0.01))}},
            jackknife={"effective_rank": {"block_01": (epochs, leave_out)}},
        )  # fmt: skip

    a, b = run("a", 10), run("b", 10)
    agg = aggregate_runs([a, b])
    _, mean_leave_out = agg.jackknife["effective_rank"]["block_01"]
    expected = (a.jackknife["effective_rank"]["block_01"][1] + b.jackknife["effective_rank"]["block_01"][1]) / 2
    np.testing.assert_allclose(mean_leave_out, expected, rtol=0, atol=1e-15)
    assert "effective_rank" not in aggregate_runs([a, run("c", 5)]).jackknife  # another G: nothing to pair
    finding = evaluate_findings(
        agg.mean, agg.points, stderr=agg.stderr, replicates=agg.replicates, leave_out=agg.jackknife
    )[0]
    assert finding.trend is not None and finding.trend.uncertainty.paired
    assert finding.trend.uncertainty.training_source.startswith("seeds")
