"""Figures draw what the tables judge (issue 23): window means with paired bands, log axes for ratios, CLS apart,
spectra with the class count and without round-off, correlation histograms whose mean is the recorded observable,
and a header that names the model by what it is."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import matplotlib.colors as mcolors
import numpy as np
import pytest
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from tests.report.synthetic import write_synthetic_run
from tgo import panels, viz
from tgo.records import DEFAULT_VIEW, RecordWriter, RunDir, load_jackknife, load_series, load_spectra
from tgo.report import hypotheses_section
from tgo.report.context import judge
from tgo.report.figures import correlation_figure, spectrum_figures
from tgo.report.hypotheses import csv_rows
from tgo.report.hypothesis_figures import FIRST_GID, LAST_GID, Profile
from tgo.report.runinfo import describe_model, read_run_info
from tgo.report.runs import load_run_data
from tgo.report.verdicts import VerdictSettings
from tgo.spectral.catalogue import CATALOGUE, Observable

POINTS = ["patch_embed", "block_01", "block_02", "block_03", "cls"]
EPOCHS = list(range(11))
GROUPS = 5
WIDE = VerdictSettings(window=0.3)  # 11 observations: windows of 4, so a window mean is not an epoch's value


def _rising(start: float, slope: float) -> Callable[[int], float]:
    return lambda e: start + slope * e


def _judged_run(root: Path) -> Path:
    """A run with the views, probe metrics and jackknife replicates the predictions read (five groups per value)."""
    rng = np.random.default_rng(23)
    series: dict[tuple[str, str], dict[str, Callable[[int], float]]] = {
        ("all", "between_image_fraction"): {p: _rising(0.05, 0.03 + 0.002 * i) for i, p in enumerate(POINTS[:-1])},
        ("all", "total_correlation"): {p: _rising(5.0, 0.4) for p in POINTS},
        ("within_image", "effective_rank"): {p: _rising(2.0 + i, 0.3) for i, p in enumerate(POINTS[:-1])},
        ("cls", "fisher_ratio"): {p: (lambda e, i=i: 0.2 * (1.4 + 0.1 * i) ** e) for i, p in enumerate(POINTS[1:])},
    }
    writer = RecordWriter(root)
    for k, epoch in enumerate(EPOCHS):
        results: dict[tuple[str, str], SimpleNamespace] = {}
        for point in POINTS:
            for view in ("all", "within_image", "cls"):
                observed, stderr, jackknife = {}, {}, {}
                for (v, metric), curves in series.items():
                    if v != view or point not in curves:
                        continue
                    value = curves[point](epoch) * (1.0 + 0.02 * rng.normal())
                    leave_out = value * (1.0 + 0.01 * rng.normal(size=GROUPS))
                    observed[metric], jackknife[metric] = value, leave_out
                    stderr[metric] = math.sqrt((GROUPS - 1) / GROUPS * np.sum((leave_out - leave_out.mean()) ** 2))
                if not observed and view != "all":
                    continue
                eigs = np.sort(np.exp(-np.arange(4) / (1.0 + epoch)))[::-1]
                results[(point, view)] = SimpleNamespace(
                    spectrum=SimpleNamespace(eigenvalues=eigs, n_rows=100, n_nonfinite=0),
                    mean=np.zeros(4),
                    covariance=np.diag(eigs),
                    observables=observed,
                    stderr=stderr,
                    jackknife=jackknife,
                )
        writer.write_observation(epoch, 10 * epoch, results, with_covariance=k in (0, len(EPOCHS) - 1))
    RunDir(root).manifest.write_text(
        json.dumps({"version": 1, "fingerprint": "same", "items": [], "num_classes": 4}), encoding="utf-8"
    )
    return root


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory):
    """The section built on `_judged_run` with windows of 4, and what its profile figures drew (before saving)."""
    root = tmp_path_factory.mktemp("judged")
    run_dir = _judged_run(root / "run")
    drawn: list[tuple[list[Profile], Figure]] = []
    original = hypotheses_section.profiles_figure

    def capture(profiles, **kwargs):
        fig = original(profiles, **kwargs)
        lines = {
            (ax.get_title().split("\n")[0], line.get_gid()): (
                [t.get_text() for t in ax.get_xticklabels()],
                np.asarray(line.get_ydata(), dtype=np.float64),
                ax.get_yscale(),
            )
            for ax in fig.axes
            for line in ax.get_lines()
            if line.get_gid() in (FIRST_GID, LAST_GID)
        }
        drawn.append((list(profiles), lines))
        return fig

    hypotheses_section.profiles_figure = capture
    try:
        ctx = judge([load_run_data(run_dir)], WIDE, figures_dir=root / "figures")
        (section,) = hypotheses_section.hypotheses_section(ctx)
    finally:
        hypotheses_section.profiles_figure = original
    rows = csv_rows(ctx.predictions, WIDE.z)
    return run_dir, SimpleNamespace(section=section, rows=rows, results=ctx.predictions), drawn


def test_every_hypothesis_figure_draws_the_tables_window_means_at_every_point(judged):
    run_dir, report, drawn = judged
    rows = {(r["metric"], r["view"], r["point"]): r for r in report.rows if r["point"]}
    lines = {key: value for _, per_figure in drawn for key, value in per_figure.items()}
    checked = 0
    for prediction, results in report.results.items():
        if not results:
            continue
        panel = f"{prediction.metric} ({prediction.view})"
        for gid, column in ((FIRST_GID, "first"), (LAST_GID, "last")):
            points, ys, _ = lines[(panel, gid)]
            assert points == [r.point for r in results]
            for point, y in zip(points, ys, strict=True):
                assert y == pytest.approx(float(rows[(prediction.metric, prediction.view, point)][column]), rel=1e-12)
                checked += 1
    assert checked >= 2 * 13
    # the test has teeth: these windows average 4 observations, which no single epoch's value equals
    series = load_series(run_dir, view="all", metrics=["between_image_fraction"])["between_image_fraction"]
    first_epoch = series["block_02"][1][0]
    row = rows[("between_image_fraction", "all", "block_02")]
    assert row["window"] == "4" and abs(float(row["first"]) - first_epoch) > 0.01


def test_the_bands_are_the_paired_jackknife_error_of_each_window_mean(judged):
    run_dir, _, drawn = judged
    profiles = {p.title.split("\n")[0]: p for per_figure, _ in drawn for p in per_figure}
    for metric, view, log in (("between_image_fraction", "all", False), ("fisher_ratio", "cls", True)):
        profile = profiles[f"{metric} ({view})"]
        assert profile.windows == ("0-3", "7-10") and profile.log is log
        replicates = load_jackknife(run_dir, view=view, metrics=[metric])[metric]
        for i, point in enumerate(profile.points):
            epochs, leave_out = replicates[point]
            values = np.log(leave_out) if log else leave_out
            for row, rows in enumerate((slice(0, 4), slice(7, 11))):
                mean_by_group = values[rows].mean(axis=0)  # the window mean, replicate by replicate
                j = math.sqrt((GROUPS - 1) / GROUPS * np.sum((mean_by_group - mean_by_group.mean()) ** 2))
                centre = math.log(profile.first[i] if row == 0 else profile.last[i]) if log else None
                low, high = (centre - j, centre + j) if log else (None, None)
                if log:
                    assert profile.low[row, i] == pytest.approx(math.exp(low), rel=1e-9)
                    assert profile.high[row, i] == pytest.approx(math.exp(high), rel=1e-9)
                else:
                    mean = profile.first[i] if row == 0 else profile.last[i]
                    assert profile.low[row, i] == pytest.approx(mean - j, rel=1e-9)
                    assert profile.high[row, i] == pytest.approx(mean + j, rel=1e-9)
        assert epochs.tolist() == EPOCHS


def test_ratio_panels_are_on_log_axes_and_say_so(judged):
    _, report, drawn = judged
    scales = {key[0]: scale for _, per_figure in drawn for key, (_, _, scale) in per_figure.items()}
    assert scales["fisher_ratio (cls)"] == "log"
    assert scales["between_image_fraction (all)"] == "linear"
    captions = [f.caption for s in report.section.subsections for f in s.figures if "hypothesis_" in f.path]
    assert any("epochs 0-3" in c and "epochs 7-10" in c and "log y axis" in c for c in captions), captions


# ------------------------------------------------------------------------------------------------ log axes
LOG_METRICS = [o.name for o in CATALOGUE if o.scale == "log"]
FIFTEEN = ["patch_embed", "pos_embed", *(f"block_{i:02d}" for i in range(1, 13)), "cls"]


def _series(points, epochs=(0, 5, 10)):
    return {p: (np.array(epochs), np.geomspace(1.0 + i, 80.0 + i, len(epochs))) for i, p in enumerate(points)}


def test_the_catalogue_names_the_ratio_observables():
    assert {"nc1", "fisher_ratio", "massive_activation_ratio"} <= set(LOG_METRICS)


@pytest.mark.parametrize("metric", [*LOG_METRICS, "effective_rank"])
def test_ratios_are_drawn_on_log_axes_in_every_figure(metric: str):
    log = CATALOGUE[metric].scale == "log"
    expected = "log" if log else "linear"
    series = _series(FIFTEEN)
    assert panels.lines_figure(series, title=metric).axes[0].get_yscale() == expected
    profiles = {e: (np.geomspace(1.0, 50.0, len(FIFTEEN)) * (1 + e), np.full(len(FIFTEEN), np.nan)) for e in (0, 5)}
    for size in (panels.PAGE, panels.CARD):  # one drawer, two sizes
        assert panels.depth_figure(profiles, FIFTEEN, title=metric, size=size).axes[0].get_yscale() == expected
    table = np.geomspace(1.0, 80.0, len(FIFTEEN) * 3).reshape(len(FIFTEEN), 3)
    (image,) = viz.layer_epoch_heatmap_figure(table, FIFTEEN, [0, 5, 10], title=metric).axes[0].get_images()
    assert isinstance(image.norm, LogNorm) is log


def test_the_scale_is_read_from_the_catalogue_not_a_list():
    toy = Observable("toy_ratio_of_spreads", lambda inputs: 1.0, "a / b", scale="log")
    CATALOGUE.register(toy)
    try:
        assert viz.is_log_scale("toy_ratio_of_spreads")
        assert panels.lines_figure(_series(POINTS), title="toy_ratio_of_spreads").axes[0].get_yscale() == "log"
    finally:
        CATALOGUE.unregister("toy_ratio_of_spreads")
    assert not viz.is_log_scale("toy_ratio_of_spreads") and not viz.is_log_scale("not_an_observable")


# ------------------------------------------------------------------------------------------------ CLS apart
def _luminance(colour) -> float:
    r, g, b = mcolors.to_rgb(colour)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_cls_has_its_own_colour_and_marker_and_neighbouring_blocks_stay_apart():
    fig = panels.lines_figure(_series(FIFTEEN), title="effective_rank")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines() if line.get_label() in FIFTEEN}
    assert list(lines) == FIFTEEN
    assert mcolors.to_hex(lines["cls"].get_color()) == "#000000" and lines["cls"].get_marker() == "s"
    others = [np.array(mcolors.to_rgb(lines[p].get_color())) for p in FIFTEEN[:-1]]
    assert all(lines[p].get_marker() != "s" for p in FIFTEEN[:-1])
    assert min(np.linalg.norm(a - b) for a, b in itertools.pairwise(others)) > 0.12  # neighbours differ
    assert max(_luminance(c) for c in others) < 0.8  # no pale yellow on a white page
    assert min(np.linalg.norm(c) for c in others) > 0.25  # none is nearly black, like CLS
    assert fig.axes[0].get_legend() is not None


@pytest.mark.parametrize("size", [panels.PAGE, panels.CARD])
def test_depth_profiles_mark_cls_apart_from_the_blocks(size: str):
    profiles = {e: (np.arange(len(FIFTEEN), dtype=float) + e, np.full(len(FIFTEEN), np.nan)) for e in (0, 5)}
    ax = panels.depth_figure(profiles, FIFTEEN, title="effective_rank", size=size).axes[0]
    (label,) = [t for t in ax.get_xticklabels() if t.get_text() == "cls"]
    assert label.get_fontweight() == "bold"
    squares = [line for line in ax.get_lines() if line.get_marker() == "s"]
    assert len(squares) == 2 and all(line.get_xdata().tolist() == [len(FIFTEEN) - 1] for line in squares)


# ------------------------------------------------------------------------------------------------ spectra
def _history():
    values = np.concatenate([np.geomspace(10.0, 1e-3, 40), np.full(8, 3e-15)])  # rank 40 of 48: round-off tail
    return [(0, values * 0.5), (5, values)]


def test_spectra_mark_the_class_count_and_leave_out_round_off():
    fig = viz.spectrum_history_figure(_history(), title="cls: eigenvalues", classes=10, card=False)
    ax = fig.axes[0]
    marks = [line for line in ax.get_lines() if line.get_gid() == "class-count"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [10.0, 10.0]
    assert any(t.get_text().strip() == "C = 10 classes" for t in ax.texts)
    drawn = [line for line in ax.get_lines() if line.get_gid() != "class-count"]
    assert all(len(line.get_xdata()) == 40 for line in drawn)
    assert ax.get_ylim()[0] > 1e-6  # the axis ends near the smallest real eigenvalue, not at 3e-15
    unknown = viz.spectrum_history_figure(_history(), title="cls: eigenvalues", classes=None, card=False).axes[0]
    assert not [line for line in unknown.get_lines() if line.get_gid() == "class-count"] and not unknown.texts


def test_tensorboard_spectrum_cards_mark_the_class_count_too():
    fig = viz.spectrum_history_figure(_history(), title="cls", classes=10)
    ax = fig.axes[0]
    (mark,) = [line for line in ax.get_lines() if line.get_gid() == "class-count"]
    assert list(mark.get_xdata()) == [1.0, 1.0]  # log10 index axes
    assert all(len(line.get_xdata()) == 40 for line in ax.get_lines() if line.get_gid() != "class-count")
    with_count = dict(viz.spectrum_cards({"cls": _history(), "block_12": _history()}, classes=10))
    without = dict(viz.spectrum_cards({"cls": _history()}))
    assert with_count["cls"].shape == without["cls"].shape and np.any(with_count["cls"] != without["cls"])


def test_the_class_count_comes_from_the_analysis_subset(tmp_path: Path):
    run = RunDir(tmp_path)
    assert panels.class_count(tmp_path) is None
    run.manifest.write_text(json.dumps({"num_classes": 10, "items": []}), encoding="utf-8")
    assert panels.class_count(tmp_path) == 10
    run.manifest.write_text(json.dumps({"items": [{"label": 0}, {"label": 3}, {"label": 3}]}), encoding="utf-8")
    assert panels.class_count(tmp_path) == 2


# ------------------------------------------------------------------------------------------------ correlation
def _mean_abs_offdiag(cov: np.ndarray) -> float:
    """numpy float64 recomputation: mean |corr_ij| over i != j of the dimensions with variance."""
    var = np.diag(cov)
    keep = var > var.max() * var.size * np.finfo(np.float64).eps
    corr = cov[np.ix_(keep, keep)] / np.sqrt(np.outer(var[keep], var[keep]))
    off = ~np.eye(int(keep.sum()), dtype=bool)
    return float(np.abs(np.clip(corr, -1, 1))[off].mean())


def test_each_correlation_panel_marks_the_recorded_mean_abs_offdiag_correlation(smoke_run: Path, tmp_path: Path):
    spectra = load_spectra(smoke_run)
    stored = [e for e in sorted(spectra) if any("covariance" in a for a in spectra[e].values())]
    chosen = list(dict.fromkeys([stored[0], stored[-1]]))
    panels = {p: {f"epoch {e}": spectra[e][p]["covariance"] for e in chosen} for p in spectra[chosen[0]]}
    fig = viz.correlation_histograms_figure(panels, title="test")
    means = {line.get_gid(): float(line.get_xdata()[0]) for ax in fig.axes for line in ax.get_lines()}
    recorded = load_series(smoke_run, view=DEFAULT_VIEW, metrics=["mean_abs_offdiag_correlation"])
    checked = 0
    for point, by_epoch in panels.items():
        epochs, values = recorded["mean_abs_offdiag_correlation"][point]
        for label, cov in by_epoch.items():
            epoch = int(label.split()[1])
            value = float(values[list(epochs).index(epoch)])
            if not math.isfinite(value):
                continue
            assert means[f"{point}|{label}"] == pytest.approx(value, rel=1e-9, abs=1e-12)
            assert means[f"{point}|{label}"] == pytest.approx(_mean_abs_offdiag(cov), rel=1e-9, abs=1e-12)
            checked += 1
    assert checked >= 2
    ref = correlation_figure(load_run_data(smoke_run), tmp_path / "figures")
    assert ref is not None and ref.section == "correlation" and "mean_abs_offdiag_correlation" in ref.caption
    assert (tmp_path / ref.path).read_bytes()[:4] == b"\x89PNG"
    # correlation=False leaves the histograms out of the spectra's figures (one stored point suffices to see it)
    small = write_synthetic_run(tmp_path / "small", {"effective_rank": {"block_01": lambda e: 1.0 + e}}, epochs=[0, 5])
    sections = {on: [r.section for r in spectrum_figures(load_run_data(small), tmp_path / str(on), correlation=on)]
                for on in (True, False)}  # fmt: skip
    assert "correlation" in sections[True] and "correlation" not in sections[False] and sections[False]


# ------------------------------------------------------------------------------------------------ the model's name
def test_the_model_is_named_by_what_it_is(tmp_path: Path):
    quick = {"patch_size": 4, "embed_dim": 96, "depth": 12, "num_heads": 3, "drop_path_rate": 0.0}
    assert describe_model("vit_tiny_patch16_224", quick, 16) == (
        "ViT, 12 blocks, width 96, 3 heads, patch 4, 16 px images (timm vit_tiny_patch16_224 with overrides)"
    )
    assert describe_model("vit_small_patch16_224", {"drop_path_rate": 0.1}, 224) == "vit_small_patch16_224"
    assert describe_model(None, quick, 16) is None
    run = RunDir(tmp_path)
    run.config.write_text(
        "data:\n  source: digits\n  image_size: 16\nmodel:\n  name: vit_tiny_patch16_224\n  arch:\n"
        "    patch_size: 4\n    embed_dim: 96\n    depth: 12\n    num_heads: 3\ntrainer:\n  max_epochs: 30\n",
        encoding="utf-8",
    )
    run.manifest.write_text(json.dumps({"num_classes": 10, "items": []}), encoding="utf-8")
    info = read_run_info(tmp_path)
    assert info.model.startswith("ViT, 12 blocks, width 96, 3 heads, patch 4, 16 px images")
    assert (info.name, info.classes) == ("vit_tiny_patch16_224", 10)


# ------------------------------------------------------------------------- non-finite spectra (issue 33, item 3)
def test_captions_name_the_epochs_and_points_whose_eigenvalues_are_not_finite(tmp_path: Path):
    """Before: NaN eigenvalues dropped an epoch's curve (and a point's decay curve) from the report without a word.
    Now each caption names what its figure could not draw; figures with finite spectra say nothing of it."""
    curves = {"effective_rank": {"block_01": lambda e: 1.0 + e, "block_02": lambda e: 2.0 + e}}
    run = write_synthetic_run(tmp_path / "run", curves, epochs=[0, 5, 10])
    for epoch, point in ((5, "block_01"), (10, "block_02")):  # as a point undefined by non-finite activations records
        path = RunDir(run).spectra(epoch)
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        arrays[f"{point}/eigenvalues"] = np.full_like(arrays[f"{point}/eigenvalues"], np.nan)
        np.savez(path, **arrays)
    captions = {Path(r.path).stem: r.caption for r in spectrum_figures(load_run_data(run), tmp_path, correlation=False)}
    assert "; non-finite, not drawn: epoch 5 (all 4) (run" in captions["eigenvalues_block_01"]
    assert "none is left out" in captions["eigenvalues_block_01"]  # NaN is not counted as round-off
    assert "; non-finite, not drawn: epoch 5 (all 4) (run" in captions["singular_values_block_01"]
    assert "; non-finite, not drawn: epoch 10 (all 4) (run" in captions["eigenvalues_block_02"]
    assert "non-finite, not drawn: block_02 (all 4) (run" in captions["decay_epoch_0010"]
    assert "non-finite" not in captions["decay_epoch_0000"]
