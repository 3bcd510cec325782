"""``--reference tgo1`` says how a run differs from the published experiment (issue 21 item 7).

The published TGO-I values come from ViT-S/16 at 224 px on ImageNet-100 for 100 epochs. A run that differs in any of
these four is overlaid with a caveat naming each difference, on the page (header, the comparison table, the
overlaid figures) and in the command line's printed summary; a run that matches all four gets none.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.report.synthetic import FEW_PAPER_POINTS, write_synthetic_run
from tgo.records import RunDir
from tgo.report.__main__ import main
from tgo.report.build import build_report
from tgo.report.reference import (
    PAPER_POINTS,
    TGO1_EXPERIMENT,
    load_reference,
    reference_caveat,
    reference_differences,
)
from tgo.report.runinfo import RunInfo, read_run_info

CURVES = {"effective_rank": {p: (lambda e, i=i: 2.0 + i + e) for i, p in enumerate(FEW_PAPER_POINTS)}}
"""The caveat is about the experiment, not the points: three of the paper's points are enough."""
PAPER_ARCH = "    patch_size: 16\n    embed_dim: 384\n    depth: 12\n    num_heads: 6\n"
QUICK_ARCH = "    patch_size: 4\n    embed_dim: 96\n    depth: 12\n    num_heads: 3\n"


def _config(
    run_dir: Path,
    *,
    model: str = "vit_small_patch16_224",
    arch: str = "    drop_path_rate: 0.1\n",
    source: str = "imagenet100",
    image_size: int = 224,
    max_epochs: int = 100,
) -> Path:
    """A run's ``config.yaml`` with the keys `read_run_info` reads (the defaults: the paper's experiment)."""
    RunDir(run_dir).config.write_text(
        f"data:\n  source: {source}\n  image_size: {image_size}\nmodel:\n  name: {model}\n  arch:\n{arch}"
        f"trainer:\n  max_epochs: {max_epochs}\nseed: 0\n",
        encoding="utf-8",
    )
    return run_dir


def _run(path: Path, **config) -> Path:
    return _config(write_synthetic_run(path, CURVES, epochs=[0, 5, 10], dim=2), **config)


def _paperlike(**overrides) -> RunInfo:
    fields = dict(model="vit_small_patch16_224", data="imagenet100", image_size=224, epochs=100)
    return RunInfo(**{**fields, **overrides})


def _paragraph_after(html: str, anchor: str) -> str:
    """The first caveat box of the section ``anchor``."""
    section = html[html.index(f'id="{anchor}"') :]
    return re.search(r'<p class="caveat">([^<]*)</p>', section[: section.index("<h2", 5)]).group(1)


def test_the_reference_experiment_is_the_shipped_files():
    paper = load_reference()
    epochs = paper["effective_rank"]["cls"][0]
    assert int(epochs[-1]) == TGO1_EXPERIMENT.epochs == 100
    assert set(paper["effective_rank"]) == set(PAPER_POINTS)
    assert (TGO1_EXPERIMENT.label, TGO1_EXPERIMENT.image_size, TGO1_EXPERIMENT.data) == ("ViT-S/16", 224, "imagenet100")


def test_a_run_of_the_paper_experiment_gets_no_caveat(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert reference_caveat([_paperlike()]) is None
    assert reference_caveat([_paperlike(arch={"patch_size": 16, "embed_dim": 384})]) is None
    run = _run(tmp_path / "paper")
    assert reference_differences([read_run_info(run)], [10]) == []
    explicit = read_run_info(_run(tmp_path / "explicit", arch=PAPER_ARCH))  # the header describes it ("ViT, 12
    assert explicit.model is not None and explicit.model.startswith("ViT")  # blocks, ..."); the caveat compares
    assert reference_differences([explicit], [10]) == []  # the recorded name and overrides, not that description
    out = tmp_path / "out"
    assert main([str(run), "--reference", "tgo1", "--out", str(out), "--no-correlation"]) == 0
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "Comparison with the published TGO-I measurements" in html
    assert "Caveat" not in html and 'class="caveat"' not in html and "compare shapes" not in html
    assert "Caveat" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("overrides", "field", "ours", "theirs"),
    [
        (dict(model="vit_tiny_patch16_224 (patch 4, dim 96)", arch={"patch_size": 4}), "model", "vit_tiny", "ViT-S/16"),
        (dict(model="vit_small_patch16_224 (patch 8)", arch={"patch_size": 8}), "model", "(patch 8)", "ViT-S/16"),
        (dict(image_size=32), "image size", "32 px", "224 px"),
        (dict(data="synthetic"), "data", "synthetic data", "ImageNet-100"),
        (dict(data="digits"), "data", "scikit-learn digits", "ImageNet-100"),
        (dict(epochs=30), "epochs", "30 epochs", "100 epochs"),
        (dict(model=None), "model", "model not recorded", "ViT-S/16"),
        (dict(image_size=None), "image size", "image size not recorded", "224 px"),
        (dict(epochs=None), "epochs", "epochs not recorded", "100 epochs"),
    ],
)
def test_each_differing_field_is_named_alone(overrides, field, ours, theirs):
    differences = reference_differences([_paperlike(**overrides)])
    assert [d.field for d in differences] == [field]
    assert ours in differences[0].ours and differences[0].reference == theirs
    caveat = reference_caveat([_paperlike(**overrides)])
    assert caveat is not None
    assert f"differs from the TGO-I experiment in {field}." in caveat
    assert ours in caveat and f"the reference: {theirs}." in caveat and caveat.endswith("Compare shapes, not values.")


def test_an_offline_observation_counts_the_epochs_its_checkpoint_completed():
    observed = _paperlike(epochs=None, kind="offline observation")
    assert reference_differences([observed], [100]) == []
    (difference,) = reference_differences([observed], [0])
    assert (difference.field, difference.ours) == ("epochs", "0 epochs")


def test_every_difference_is_named_on_the_page_and_in_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    quick = dict(model="vit_tiny_patch16_224", arch=QUICK_ARCH, source="synthetic", image_size=32, max_epochs=30)
    run = _run(tmp_path / "quick", **quick)
    expected = (
        "Caveat: this run differs from the TGO-I experiment in model, image size, data and epochs. This run: "
        "ViT, 12 blocks, width 96, 3 heads, patch 4, 32 px images (timm vit_tiny_patch16_224 with overrides), 32 px, "
        "synthetic data, 30 epochs; the reference: "
        "ViT-S/16, 224 px, ImageNet-100, 100 epochs. Compare shapes, not values."
    )
    out = tmp_path / "out"
    assert main([str(run), "--reference", "tgo1", "--out", str(out), "--no-correlation"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("[tgo] report: ") and printed[1] == f"[tgo] {expected}"
    html = (out / "index.html").read_text(encoding="utf-8")
    for anchor in ("header", "reference", "observables"):  # the header, the table, the overlaid figures
        assert _paragraph_after(html, anchor) == expected, anchor
    assert "compare shapes, not values; see the caveat" in html  # each overlaid figure's caption
    # Without --reference there is no overlay and no caveat: tests/report/test_glance.py.


def test_several_runs_name_each_value(tmp_path: Path):
    a = _run(tmp_path / "sweep" / "a", max_epochs=30)
    b = _run(tmp_path / "sweep" / "b", max_epochs=50)
    caveat = reference_caveat([read_run_info(a), read_run_info(b)])
    assert caveat == (
        "Caveat: these runs differ from the TGO-I experiment in epochs. These runs: 30 epochs / 50 epochs; the "
        "reference: 100 epochs. Compare shapes, not values."
    )
    html = build_report([tmp_path / "sweep"], reference="tgo1", correlation=False).read_text(encoding="utf-8")
    assert caveat in html
