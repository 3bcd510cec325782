"""The recipes of ``docs/extending.md``, each carried out exactly as the page says.

(a) an observable registered with ``CATALOGUE.register`` is returned by ``summarize``, recorded by a real observation
    and charted; (b) an observation point added through ``observation.points.extra`` (a Hydra override, no code) is
    recorded with the right number of rows and the right width; (c) a data source added to the source table gives a
    ``TGODataModule`` with an analysis subset; (d) ``conf/observation/default.yaml`` and ``ObservationSettings`` hold
    the same settings with the same defaults, so a setting cannot be added in one place only; (e) a measurement
    family in two small files (``tests/observatory/mean_norm.py``, its numerics; ``mean_norm_family.py``, its
    declaration), registered with ``register_family``, is recorded by ``tgo.observe_model`` with jackknife standard
    errors, is in the catalogue, and its declared panel is a TensorBoard card and a figure of the report; (f) a
    report section, one function of the report's context added to ``SECTIONS``, is on the page.

The global state a recipe changes (the catalogue, the families, the source table) is restored afterwards, so other
tests are unaffected.
Tiny sizes throughout: the whole file runs in seconds once torch and timm are imported.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import TensorDataset
from torch.utils.tensorboard import SummaryWriter

from tests.observatory.mean_norm_family import MeanNormFamily
from tgo import panels
from tgo.data import TGODataModule
from tgo.data.datasets import ArrayImageSplit
from tgo.data.errors import DataConfigError
from tgo.data.sources import SourceArgs, SourceData, register_source, source_names, unregister_source
from tgo.model import build_timm_model
from tgo.observatory import (
    FigureSettings,
    ObservationSettings,
    RecordPlan,
    ShardPlan,
    observe_and_record,
    points_from_config,
)
from tgo.observatory.families import MeasurementFamily, register_family, registered_families, unregister_family
from tgo.observe import compose_observe_config
from tgo.records import RecordWriter, load_jackknife, load_metrics, load_series, load_spectra, recorded_epochs
from tgo.report import cells
from tgo.report.context import Context
from tgo.report.html import Section, Table
from tgo.spectral import CATALOGUE, Observable, SpectralInputs, StreamingCovariance, eigendecompose, summarize

REPO = Path(__file__).resolve().parents[1]
OBSERVATION_YAML = REPO / "conf" / "observation" / "default.yaml"

IMG, PATCH, WIDTH, DEPTH, HEADS = 16, 4, 16, 2, 2
TOKENS = (IMG // PATCH) ** 2 + 1  # 16 patches + CLS
N_IMAGES = 12


# ------------------------------------------------------------------------------------------------------------ helpers
def tiny_vit() -> torch.nn.Module:
    """A 2-block, width-16 timm ViT at 16 px, patch 4 (random init, no head)."""
    torch.manual_seed(0)
    return build_timm_model(
        "vit_tiny_patch16_224",
        num_classes=0,
        img_size=IMG,
        patch_size=PATCH,
        depth=DEPTH,
        embed_dim=WIDTH,
        num_heads=HEADS,
    )


def random_images(n: int = N_IMAGES) -> TensorDataset:
    return TensorDataset(torch.randn(n, 3, IMG, IMG, generator=torch.Generator().manual_seed(1)))


def observe_once(run_dir: Path, settings: ObservationSettings, epoch: int = 0) -> Any:
    """One single-process observation of the tiny ViT, recorded in ``run_dir`` (the callback's code path)."""
    net = tiny_vit()
    points = points_from_config(settings.points, net)
    return observe_and_record(
        net,
        random_images(),
        points,
        settings=settings,
        plan=ShardPlan(batch_size=5),
        record=RecordPlan(RecordWriter(run_dir), epoch=epoch, step=0),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )


# ------------------------------------------------------------------------------------------ (a) add an observable
def log_top_eigenvalue(eigs: np.ndarray) -> float:
    """``ln lambda_1``: the pure function of recipe (a) (NaN for an undefined or all-zero spectrum)."""
    e = np.asarray(eigs, dtype=np.float64)
    if e.size == 0 or not np.all(np.isfinite(e)) or e.max() <= 0:
        return math.nan
    return float(np.log(e.max()))


@pytest.fixture
def registered_observable() -> Iterator[Observable]:
    """Recipe (a) from user code: ``CATALOGUE.register(Observable(...))``, undone afterwards."""
    observable = Observable(
        "log_top_eigenvalue",
        lambda inputs: log_top_eigenvalue(inputs.eigenvalues),
        "ln lambda_1",
        spread=None,
        charted=True,
    )
    CATALOGUE.register(observable)
    try:
        yield observable
    finally:
        CATALOGUE.unregister("log_top_eigenvalue")
    assert "log_top_eigenvalue" not in CATALOGUE


def test_registered_observable_is_summarized_before_the_diagnostics(registered_observable: Observable) -> None:
    x = torch.randn(200, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * torch.arange(1, 9)
    acc = StreamingCovariance(8)
    acc.update(x)
    cov = acc.covariance()
    spectrum = eigendecompose(cov, acc.n, acc.n_nonfinite)

    row = summarize(cov, spectrum)

    assert row["log_top_eigenvalue"] == pytest.approx(math.log(spectrum.eigenvalues[0]), rel=1e-12)
    assert row["log_top_eigenvalue"] == pytest.approx(math.log(row["top_eigenvalue"]), rel=1e-12)
    names = list(row)
    assert names.index("log_top_eigenvalue") < names.index("n_rows"), "geometry entries come before diagnostics"
    assert "log_top_eigenvalue" in CATALOGUE.charted
    # an undefined covariance gives NaN for a geometry observable, without calling it
    undefined = summarize(np.full((8, 8), np.nan), eigendecompose(np.full((8, 8), np.nan), n_rows=1))
    assert math.isnan(undefined["log_top_eigenvalue"])
    # the entry computes from SpectralInputs exactly like the summary does
    assert registered_observable.compute(SpectralInputs(cov.numpy(), spectrum)) == row["log_top_eigenvalue"]


def test_registered_observable_is_recorded_by_a_real_observation(
    registered_observable: Observable, tmp_path: Path
) -> None:
    results = observe_once(tmp_path, ObservationSettings())

    assert results is not None
    series = load_series(tmp_path, metrics=["log_top_eigenvalue", "top_eigenvalue"])
    recorded = series["log_top_eigenvalue"]
    assert list(recorded) == ["patch_embed", "pos_embed", "block_01", "block_02", "cls"]
    for point, (epochs, values) in recorded.items():
        assert epochs.tolist() == [0]
        top = series["top_eigenvalue"][point][1][0]
        assert values[0] == pytest.approx(math.log(top), rel=1e-12), point
        assert results[point].observables["log_top_eigenvalue"] == values[0]  # records hold the exact float


def test_unregistered_observable_is_gone(tmp_path: Path) -> None:
    """After the fixture, the catalogue and every new record are back to the built-in observables."""
    assert "log_top_eigenvalue" not in CATALOGUE
    assert "log_top_eigenvalue" not in CATALOGUE.charted
    observe_once(tmp_path, ObservationSettings())
    assert "log_top_eigenvalue" not in load_series(tmp_path)


def test_a_duplicate_observable_name_is_refused(registered_observable: Observable) -> None:
    with pytest.raises(ValueError, match="already in the catalogue"):
        CATALOGUE.register(dataclasses.replace(registered_observable))


# --------------------------------------------------------------------------------- (b) add an observation point
EXTRA_OVERRIDE = (
    "observation.points.extra=["
    "{name: block_01_attn, module: blocks.0.attn},"
    "{name: block_02_mlp_hidden_cls, module: blocks.1.mlp.fc1, read: output, tokens: cls}]"
)


def test_extra_points_from_a_command_line_override_are_recorded(tmp_path: Path) -> None:
    cfg = compose_observe_config([EXTRA_OVERRIDE])  # what `python -m tgo.observe ... '<override>'` composes
    settings = ObservationSettings.from_config(cfg.observation)
    assert [p["name"] for p in settings.points["extra"]] == ["block_01_attn", "block_02_mlp_hidden_cls"]

    observe_once(tmp_path, settings)

    n_rows = load_series(tmp_path, metrics=["n_rows"])["n_rows"]
    assert list(n_rows) == [
        "patch_embed",
        "pos_embed",
        "block_01",
        "block_02",
        "cls",
        "block_01_attn",
        "block_02_mlp_hidden_cls",
    ]  # preset first, then extras in config order
    assert n_rows["block_01_attn"][1].tolist() == [N_IMAGES * TOKENS]  # every token of every image
    assert n_rows["block_02_mlp_hidden_cls"][1].tolist() == [N_IMAGES]  # one CLS row per image
    assert n_rows["patch_embed"][1].tolist() == [N_IMAGES * (TOKENS - 1)]  # patch tokens only
    spectra = load_spectra(tmp_path, arrays=("eigenvalues",))[0]
    assert spectra["block_01_attn"]["eigenvalues"].shape == (WIDTH,)
    assert spectra["block_02_mlp_hidden_cls"]["eigenvalues"].shape == (4 * WIDTH,)  # the MLP's hidden width
    assert recorded_epochs(tmp_path) == [0]


def test_the_training_callback_reads_the_same_override(tmp_path: Path) -> None:
    conf = REPO / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("train", overrides=[f"paths.output_dir={tmp_path}", "experiment=smoke", EXTRA_OVERRIDE])
    callback = instantiate(cfg.callbacks.spectral_geometry)
    assert [p["module"] for p in callback.settings.points["extra"]] == ["blocks.0.attn", "blocks.1.mlp.fc1"]
    assert callback.settings.every_n_epochs == 1  # the experiment's observation.every_n_epochs reached it too


def test_a_misspelt_module_path_fails_before_any_forward(tmp_path: Path) -> None:
    settings = ObservationSettings.from_config(
        {"points": {"preset": "vit", "extra": [{"name": "bad", "module": "blocks.0.atn"}]}}
    )
    with pytest.raises(ValueError, match=r"did you mean 'blocks\.0\.attn'"):
        observe_once(tmp_path, settings)
    assert not any(tmp_path.iterdir()), "nothing is recorded when a point does not resolve"


# ------------------------------------------------------------------------------------------- (c) add a data source
TOY_CLASSES, TOY_VAL_PER_CLASS, TOY_TRAIN_PER_CLASS = 3, 6, 4


def build_toy_source(args: SourceArgs) -> SourceData:
    """Recipe (c)'s builder: splits without transforms, class names, and facts for the manifest."""
    rng, mode = np.random.default_rng(args.seed), args.mode

    def split(per_class: int, offset: int) -> ArrayImageSplit:
        labels = np.repeat(np.arange(TOY_CLASSES), per_class)
        images = rng.integers(0, 256, size=(labels.size, 8, 8), dtype=np.uint8)
        return ArrayImageSplit(images, np.arange(labels.size) + offset, labels, mode=mode)

    return SourceData(
        train=split(TOY_TRAIN_PER_CLASS, 0),
        val=split(TOY_VAL_PER_CLASS, 10_000),
        class_names=[f"toy_{c}" for c in range(TOY_CLASSES)],
        photo=False,
        info={"seed": args.seed},
    )


@pytest.fixture
def toy_source() -> Iterator[str]:
    """Recipe (c), step 2, from user code: register the builder; unregistered afterwards."""
    register_source("toy", build_toy_source)
    try:
        yield "toy"
    finally:
        unregister_source("toy")


def test_a_new_source_gives_a_datamodule_with_its_analysis_subset(toy_source: str, tmp_path: Path) -> None:
    dm = TGODataModule(
        source=toy_source,
        image_size=IMG,
        batch_size=4,
        train_transform="none",
        analysis={"size": None, "per_class": 2, "seed": 2025, "manifest": None, "batch_size": 4},
    )
    dm.setup("fit")

    assert dm.num_classes == TOY_CLASSES
    subset = dm.analysis_dataset
    assert len(subset) == 2 * TOY_CLASSES
    assert np.bincount(subset.labels).tolist() == [2] * TOY_CLASSES  # stratified: every class, per_class each
    image, label = subset[0]
    assert tuple(image.shape) == (3, IMG, IMG) and image.dtype == torch.float32 and label == 0
    assert len(dm.train_dataset) == TOY_CLASSES * TOY_TRAIN_PER_CLASS
    manifest = dm.manifest()
    assert manifest["source"] == "toy" and manifest["size"] == 2 * TOY_CLASSES
    assert dm.write_manifest(tmp_path).is_file()

    # the same subset is what an observation streams (3 jackknife groups: 6 images leave no group empty)
    settings = ObservationSettings(groups=3)
    net = tiny_vit()
    observe_and_record(
        net,
        subset,
        points_from_config(settings.points, net),
        settings=settings,
        plan=ShardPlan(batch_size=dm.analysis_batch_size),
        record=RecordPlan(RecordWriter(tmp_path), epoch=0, step=0),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )
    assert load_series(tmp_path, metrics=["n_rows"])["n_rows"]["cls"][1].tolist() == [2 * TOY_CLASSES]


def test_an_unregistered_source_is_refused() -> None:
    """Outside the fixture the source table is the built-in one again."""
    assert "toy" not in source_names() and "digits" in source_names()
    with pytest.raises(DataConfigError, match=r"data\.source='toy' is unknown"):
        TGODataModule(source="toy")


# -------------------------------------------------------------------------------------- (d) add an observation setting
def _yaml_settings() -> dict[str, Any]:
    """The ``observation`` node Hydra composes: ``conf/observation/default.yaml`` (the core's settings) over the
    sections the registered families publish from their own declarations (``observation/families``)."""
    values = OmegaConf.to_container(compose_observe_config().observation, resolve=True)
    assert isinstance(values, dict)
    return values


def _default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise AssertionError(f"ObservationSettings.{field.name} has no default; every setting needs one")


@pytest.mark.parametrize(("cls", "path"), [(ObservationSettings, ()), (FigureSettings, ("figures",))])
def test_yaml_keys_are_exactly_the_settings_fields(cls: type, path: tuple[str, ...]) -> None:
    values: Any = _yaml_settings()
    for key in path:
        values = values[key]
    fields = [f.name for f in dataclasses.fields(cls) if f.name != "extra"] + list(cls().extra)  # + families' keys
    prefix = ".".join(("observation", *path))
    assert sorted(values) == sorted(fields), (
        f"{prefix}: keys in {OBSERVATION_YAML.relative_to(REPO)} {sorted(values)} != fields of {cls.__name__} "
        f"{sorted(fields)}; add a setting in both places"
    )


def test_every_setting_has_a_default_equal_to_the_yaml_value() -> None:
    yaml_values = _yaml_settings()
    own = {f.name: _default_of(f) for f in dataclasses.fields(ObservationSettings) if f.name != "extra"}
    for name, default in {**own, **ObservationSettings().extra}.items():  # the families' sections too
        if dataclasses.is_dataclass(default):
            for sub in dataclasses.fields(default):
                if sub.name != "extra":
                    assert _default_of(sub) == yaml_values[name][sub.name], f"observation.{name}.{sub.name}"
        else:
            assert default == yaml_values[name], f"observation.{name}"
    # and the validated forms agree too (lists vs tuples, nested figures)
    assert ObservationSettings.from_config(yaml_values) == ObservationSettings()
    assert ObservationSettings().to_dict() == yaml_values


def test_a_file_source_requires_its_root_before_anything_is_scanned(tmp_path: Path) -> None:
    register_source("toy_files", build_toy_source, needs_root=True)
    try:
        with pytest.raises(DataConfigError, match=r"data\.root is required for source=toy_files"):
            TGODataModule(source="toy_files")
        with pytest.raises(ValueError, match="already registered"):
            register_source("toy_files", build_toy_source)
    finally:
        unregister_source("toy_files")


# ------------------------------------------------------------------- (e) add a family with a card and a report panel
@pytest.fixture
def mean_norm() -> Iterator[MeasurementFamily]:
    """Recipe (e): the toy family (``tests/observatory/mean_norm*.py``) registered, and unregistered afterwards."""
    family = register_family(MeanNormFamily())
    try:
        yield family
    finally:
        unregister_family("mean_norm")
    assert "mean_token_norm" not in CATALOGUE and "mean_norm" not in {f.name for f in registered_families()}
    assert not [p for p in panels.declared() if p.metric == "mean_token_norm"]


# ------------------------------------------------------------------------------------------- (f) add a report section
def mean_norm_section(ctx: Context) -> list[Section]:
    """Recipe (f): the last observation's mean token norm per point (no section when nothing recorded it)."""
    per_point = ctx.agg.mean.get("mean_token_norm")
    if not per_point:
        return []
    rows = [[point, cells.number(values[-1])] for point, (_, values) in per_point.items()]
    return [Section("Mean token norm", "mean-norm", tables=[Table(["point", "mean_token_norm"], rows, left=[0])])]


def test_recipes_e_and_f_a_family_is_recorded_catalogued_carded_and_reported(
    mean_norm: MeasurementFamily, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The toy family of recipe (e), as the page writes it: observed twice with ``tgo.observe_model``, its metric is
    in ``metrics.csv`` (with jackknife standard errors) and the catalogue, its declared panel is a TensorBoard card
    (read back from the event file) and a figure of the report, with its caption; and the section of recipe (f),
    added to ``SECTIONS``, is on the page with the recorded numbers."""
    import tgo
    from tgo.callbacks.dashboard import draw_figures
    from tgo.report import build

    run = tmp_path / "run"
    labelled = TensorDataset(random_images().tensors[0], torch.arange(N_IMAGES) % 3)
    assert CATALOGUE["mean_token_norm"].views == ("all",) and CATALOGUE["mean_token_norm"].scope == "family"
    for epoch in (0, 1):
        results = tgo.observe_model(tiny_vit(), labelled, out=run, epoch=epoch, groups=3, probes={"enabled": False})

    rows = load_metrics(run)
    mine = rows[rows.metric == "mean_token_norm"]
    assert set(mine.point) == {p for p, _ in results} and set(mine.view) == {"all"} and set(mine.epoch) == {0, 1}
    assert (mine.value > 0).all() and np.isfinite(mine.stderr).all() and (mine.stderr > 0).all()
    block = mine[(mine.point == "block_01") & (mine.epoch == 1)]
    assert block.value.item() == results["block_01"].observables["mean_token_norm"]
    assert load_jackknife(run)["mean_token_norm"]["block_01"][1][0].shape == (3,)

    writer = SummaryWriter(str(tmp_path / "tb"))
    cards_only = FigureSettings(spectra=False, histograms=False, decay=False, layer_epoch=False, bands=False)
    draw_figures(writer, run, 1, results, [0, 1], cards_only)
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0}).Reload()
    assert "1_depth_profile/mean_token_norm" in events.Tags()["images"]
    assert [e.step for e in events.Images("1_depth_profile/mean_token_norm")] == [1]

    monkeypatch.setattr(build, "SECTIONS", (*build.SECTIONS, mean_norm_section))  # recipe (f), step 2
    report = build.build_report([run], out=tmp_path / "report", correlation=False)
    page = report.read_text(encoding="utf-8")
    assert (report.parent / "figures" / "depth_mean_token_norm.png").is_file()
    assert "mean_token_norm against depth" in page
    section = page.split('id="mean-norm"')[1]
    assert re.search(rf">block_01</td><td[^>]*>{re.escape(cells.number(block.value.item()))}</td>", section)
