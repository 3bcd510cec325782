"""The report read at a glance: its header, one observation, mixed runs refused, the opt-in published overlay,
depth profiles, and captions that say what the figures draw."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.report.synthetic import FEW_PAPER_POINTS, write_run_config, write_synthetic_run
from tgo.panels import lines_figure
from tgo.records import RunDir
from tgo.report.__main__ import main
from tgo.report.build import build_report
from tgo.report.runinfo import NOT_RECORDED, read_run_info
from tgo.report.runs import ReportInputError, load_run_data
from tgo.report.sections import header_rows
from tgo.viz import DECAY_FLOOR, decay_curves_figure

CURVES = {
    "effective_rank": {"patch_embed": lambda e: 2.0 + 0.1 * e, "block_01": lambda e: 3.0 + e, "cls": lambda e: 4 + e},
    "spectral_anisotropy": {"patch_embed": lambda e: 0.5 + 0 * e, "block_01": lambda e: 1.0 - 0.05 * e},
}
ERRORS = {"effective_rank": {"block_01": lambda e: 0.1 + 0 * e}}


def _run(path: Path, *, epochs=tuple(range(0, 11)), curves=CURVES, **config) -> Path:
    write_synthetic_run(path, curves, epochs=epochs, stderr=ERRORS)
    return write_run_config(path, **config)


def _header(index: Path) -> dict[str, str]:
    html = index.read_text(encoding="utf-8")
    block = html[html.index('id="header"') : html.index('id="findings"')]
    return dict(re.findall(r'<td class="l ">([^<]*)</td><td class="l ">([^<]*)</td>', block))


def test_the_header_says_what_the_run_is(tmp_path: Path):
    run = _run(tmp_path / "run", max_epochs=30, seed=7)
    info = read_run_info(run)
    assert (info.data, info.image_size, info.epochs, info.seed, info.subset_size) == ("digits", 24, 30, 7, 200)
    assert info.model == "ViT, width 96, patch 4, 24 px images (timm vit_tiny_patch16_224 with overrides)"
    assert (info.top1, info.top5) == (0.9749, 1.0)
    rows = dict(header_rows([load_run_data(run)], [info]))
    assert rows["final val top-1"] == "97.49%" and rows["final val top-5"] == "100.00%"
    assert rows["epochs (planned)"] == "30" and rows["seed(s)"] == "7"
    assert rows["analysis subset"] == "200 images, fingerprint same"
    assert rows["git commit (run)"] == NOT_RECORDED and rows["tgo version"]
    header = _header(build_report([run], correlation=False))
    assert (
        header["model"] == "ViT, width 96, patch 4, 24 px images (timm vit_tiny_patch16_224 with overrides)"
        and header["data source"] == "digits"
    )
    assert header["epochs observed"] == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 (11 observations)"
    assert "git commit (report)" in header


def test_what_a_run_does_not_hold_reads_not_recorded(tmp_path: Path):
    bare = write_synthetic_run(tmp_path / "bare", CURVES, fingerprint=None)
    rows = dict(header_rows([load_run_data(bare)], [read_run_info(bare)]))
    for field in ("model", "data source", "final val top-1", "final val top-5", "seed(s)"):
        assert rows[field] == NOT_RECORDED, field
    no_log = _run(tmp_path / "nolog", accuracies=None)
    assert read_run_info(no_log).top1 is None
    for damaged in (b"data: [unclosed\n", b"data:\n  source: caf\xe9\n"):  # not YAML; Latin-1, not UTF-8
        RunDir(bare).config.write_bytes(damaged)
        assert read_run_info(bare).data is None


def test_a_single_observation_is_drawn_with_markers_and_explained(tmp_path: Path):
    run = _run(tmp_path / "one", epochs=[30])
    index = build_report([run], correlation=False)
    html = index.read_text(encoding="utf-8")
    findings = html[html.index('id="findings"') : html.index('id="runs"')]
    assert "Only one observation (epoch 30)" in findings and "<table" not in findings
    hypotheses = html[html.index('id="hypotheses"') :]
    assert "no prediction about a change over training can be judged" in hypotheses
    assert "n/a at" not in hypotheses  # no table of n/a rows
    assert "at the single observation, one marker per point" in html
    assert "Observables against depth" in html and (index.parent / "figures" / "depth_effective_rank.png").is_file()
    fig = lines_figure(
        {"block_01": (np.array([30]), np.array([1.0])), "cls": (np.array([30]), np.array([2.0]))}, title="one"
    )
    assert [line.get_marker() for line in fig.axes[0].lines] == ["o", "s"]  # a marker alone; CLS a square


def test_a_sweep_gets_depth_profiles_and_a_header_of_every_seed(tmp_path: Path):
    for seed in (1, 2):
        _run(tmp_path / "sweep" / str(seed), seed=seed)
    index = build_report([tmp_path / "sweep"], correlation=False)
    html = index.read_text(encoding="utf-8")
    assert _header(index)["seed(s)"] == "1, 2"
    assert "runs agreeing (of 2)" in html
    assert "one line per observed epoch, colour = epoch (colourbar); band = mean ± 1 standard deviation" in html
    for metric in ("effective_rank", "spectral_anisotropy"):
        assert (index.parent / "figures" / f"depth_{metric}.png").is_file()


@pytest.mark.parametrize(
    ("other", "what"),
    [
        ({"model": "vit_small_patch16_224"}, "model differs"),
        ({"source": "synthetic"}, "data differs"),
        ({"image_size": 32}, "image size differs"),
    ],
)
def test_runs_of_different_experiments_are_refused_saying_what_differs(tmp_path: Path, other: dict, what: str):
    _run(tmp_path / "mixed" / "a")
    _run(tmp_path / "mixed" / "b", **other)
    with pytest.raises(ReportInputError, match=what):
        build_report([tmp_path / "mixed"], correlation=False)


def test_runs_with_different_points_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    _run(tmp_path / "mixed" / "a")
    fewer = {m: {p: f for p, f in c.items() if p != "cls"} for m, c in CURVES.items()}
    _run(tmp_path / "mixed" / "b", curves=fewer)
    assert main([str(tmp_path / "mixed"), "--out", str(tmp_path / "out"), "--no-correlation"]) == 2
    err = capsys.readouterr().err
    assert "points differs" in err and "not averaged" in err and err.count("\n") == 1


def test_the_published_overlay_is_opt_in_with_a_caveat_when_the_experiment_differs(tmp_path: Path):
    curves = {"effective_rank": {p: (lambda e, i=i: 2.0 + i + e) for i, p in enumerate(FEW_PAPER_POINTS)}}
    quick = write_run_config(write_synthetic_run(tmp_path / "quick", curves, epochs=[0, 5, 10], dim=2))
    html = build_report([quick], correlation=False).read_text(encoding="utf-8")
    assert "published TGO-I" not in html and "Caveat" not in html  # opt-in: --reference (the caveat itself, a
    # matching run without one and every differing field: tests/report/test_reference_caveat.py)
    fig = lines_figure(
        {"cls": (np.arange(11), np.arange(11.0))},
        title="t",
        reference={"cls": (np.arange(1, 101), np.ones(100))},
        run_epochs=10,
    )
    assert len(fig.axes) == 2  # the published series on axes of their own
    assert fig.axes[0].get_xlim()[1] <= 1.1 and fig.axes[1].get_xlim() == fig.axes[0].get_xlim()


def test_captions_and_axes_say_what_is_drawn(tmp_path: Path):
    run = _run(tmp_path / "run")
    html = build_report([run]).read_text(encoding="utf-8")
    assert "every pair i != j of the 4 features" in html and "first 192" not in html  # the features drawn
    assert "later epochs darker" not in html and "dark = first, yellow = last; colourbar" in html
    fig = lines_figure({"cls": (np.arange(3), np.arange(3.0))}, title="t")
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks)  # integer epoch ticks, not 0.25 steps
    eigs = np.array([1.0, 1e-2, 1e-4, 1e-17, 1e-19])  # the last two are round-off
    fig = decay_curves_figure({"block_01": eigs}, title="decay", card=False)
    low, high = fig.axes[0].get_ylim()
    assert low >= DECAY_FLOOR / 10 and low < 1e-4 and high <= 10
