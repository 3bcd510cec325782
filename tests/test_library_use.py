"""TGO as a library from a researcher's own code (issue 21 items 1 and 2): the callback in any Lightning training,
``tgo.data.stratified_subset`` and ``tgo.observe_model`` in plain PyTorch."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import tgo
from tgo.callbacks import SpectralGeometryCallback
from tgo.data import TGODataModule, select_analysis_indices, stratified_subset
from tgo.data.subsets import AnalysisSetError, dataset_labels
from tgo.errors import UserInputError
from tgo.observatory import ObservationSettings, RecordPlan, ShardPlan, observe_and_record, points_from_config
from tgo.observatory.families.noise_scale import NOISE_SCALE
from tgo.observatory.find_vit import ModelLookupError, find_vit
from tgo.observatory.standalone import RunDirectoryError
from tgo.records import RecordWriter, RunDir, load_spectra, read_metric_rows, recorded_epochs

CLASSES = 4
IMG = 16
FAST: dict[str, Any] = {"probes": {"enabled": False}, "groups": 2, "figures": {"heatmaps": False}}
"""Observation settings that keep a test's observation well under a second."""


def tiny_vit(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=IMG, patch_size=4, depth=2, embed_dim=16, num_heads=2,
        num_classes=CLASSES,
    )  # fmt: skip


def images(n: int, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, IMG, IMG, generator=generator), torch.arange(n) % CLASSES)


class Classifier(L.LightningModule):
    """A user's own module: the ViT under any attribute (``attr``), optionally nested, plus extra modules."""

    def __init__(self, attr: str = "backbone", extra: dict[str, nn.Module] | None = None, seed: int = 0) -> None:
        super().__init__()
        setattr(self, attr, tiny_vit(seed))
        self.attr = attr
        for name, module in (extra or {}).items():
            setattr(self, name, module)
        self.steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.attr)(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps += 1
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(root: Path, callback: L.Callback, epochs: int = 1) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs,
        default_root_dir=root,
        callbacks=[callback],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=1,
        limit_val_batches=0,
    )


def fit(root: Path, module: L.LightningModule, callback: L.Callback, epochs: int = 1) -> L.Trainer:
    t = trainer(root, callback, epochs)
    t.fit(module, DataLoader(images(8, seed=1), batch_size=4))
    return t


def fails_in_setup(root: Path, module: Classifier, callback: L.Callback, error: type[Exception], match: str) -> str:
    """Fits, expects ``error`` matching ``match`` before any training step, returns its one-line message."""
    t = trainer(root, callback)
    with pytest.raises(error, match=match) as caught:
        t.fit(module, DataLoader(images(8, seed=1), batch_size=4))
    assert module.steps == 0 and t.global_step == 0, "failed after a training step"
    message = str(caught.value)
    assert "\n" not in message, message
    return message


# ----------------------------------------------------------------------------------------------------- the callback
def test_own_module_with_a_backbone_and_plain_dataloaders_records_without_a_datamodule(tmp_path: Path) -> None:
    analysis = stratified_subset(images(24), per_class=3, seed=0)
    callback = SpectralGeometryCallback(analysis=analysis, every_n_epochs=1, **FAST)
    (tmp_path / "notes.txt").write_text("the user's own file\n", encoding="utf-8")
    fit(tmp_path, Classifier("backbone"), callback, epochs=2)
    assert recorded_epochs(tmp_path) == [0, 1, 2]
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "the user's own file\n", "a foreign file was touched"
    assert not RunDir(tmp_path).is_marked(), "the user's directory is not made a tgo.train run"
    manifest = json.loads(RunDir(tmp_path).manifest.read_text(encoding="utf-8"))
    assert manifest["written_by"].startswith("tgo.callbacks.SpectralGeometryCallback")
    assert manifest["size"] == 12 and manifest["per_class"] == 3 and manifest["seed"] == 0
    assert [item["key"] for item in manifest["items"]] == list(analysis.indices)
    assert manifest["jackknife"]["groups"] == 2


def test_a_dataloader_as_analysis_gives_its_dataset_batch_size_and_workers_and_self_model_is_found(
    tmp_path: Path,
) -> None:
    loader = DataLoader(stratified_subset(images(16), per_class=2), batch_size=3, num_workers=0)
    callback = SpectralGeometryCallback(analysis=loader, **FAST)
    fit(tmp_path, Classifier("model"), callback)
    assert callback._analysis_batch_size == 3 and callback._analysis_num_workers == 0
    assert recorded_epochs(tmp_path) == [0, 1]


def test_a_named_path_or_a_callable_chooses_among_several_vits(tmp_path: Path) -> None:
    teacher = nn.Module()
    teacher.vit = tiny_vit(seed=5)
    analysis = stratified_subset(images(8), per_class=2)
    by_path = SpectralGeometryCallback(analysis=analysis, model="teacher.vit", **FAST)
    fit(tmp_path / "path", Classifier("student", {"teacher": teacher}), by_path)
    by_callable = SpectralGeometryCallback(analysis=analysis, model=lambda module: module.teacher.vit, **FAST)
    fit(tmp_path / "callable", Classifier("student", {"teacher": teacher}), by_callable)
    path, called = (load_spectra(tmp_path / name)[0] for name in ("path", "callable"))
    assert np.array_equal(path["cls"]["eigenvalues"], called["cls"]["eigenvalues"])


def test_several_vits_fail_in_setup_before_any_step_listing_them(tmp_path: Path) -> None:
    module = Classifier("student", {"teacher": tiny_vit(seed=5)})
    callback = SpectralGeometryCallback(analysis=stratified_subset(images(8), per_class=2), **FAST)
    message = fails_in_setup(tmp_path, module, callback, ModelLookupError, "found 2 timm Vision Transformers")
    assert "student (VisionTransformer)" in message and "teacher (VisionTransformer)" in message
    assert "model='student'" in message
    assert not (tmp_path / "geometry").exists()


def test_no_vit_fails_in_setup_listing_what_the_module_holds(tmp_path: Path) -> None:
    module = Classifier("backbone")
    module.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(CLASSES))
    callback = SpectralGeometryCallback(analysis=stratified_subset(images(8), per_class=2), **FAST)
    message = fails_in_setup(tmp_path, module, callback, ModelLookupError, "found no timm Vision Transformer")
    assert "backbone (Sequential)" in message and "model=" in message


def test_a_missing_model_path_names_what_exists_and_a_non_vit_is_refused(tmp_path: Path) -> None:
    analysis = stratified_subset(images(8), per_class=2)
    missing = SpectralGeometryCallback(analysis=analysis, model="encoder.vit", **FAST)
    message = fails_in_setup(tmp_path, Classifier("backbone"), missing, ModelLookupError, "has no attribute 'encoder'")
    assert "backbone (VisionTransformer)" in message
    head = SpectralGeometryCallback(analysis=analysis, model="backbone.head", **FAST)
    fails_in_setup(tmp_path, Classifier(), head, ModelLookupError, "is a Linear, not a timm Vision Transformer")


def test_no_analysis_anywhere_fails_in_setup_in_one_line(tmp_path: Path) -> None:
    callback = SpectralGeometryCallback(**FAST)
    message = fails_in_setup(tmp_path, Classifier(), callback, UserInputError, "no analysis set")
    assert "analysis=" in message and "analysis_dataset" in message


class _Stream(IterableDataset):
    def __iter__(self) -> Any:
        yield torch.zeros(3, IMG, IMG), 0


class _Items(Dataset):
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


@pytest.mark.parametrize(
    "analysis, match",
    [
        (_Stream(), "not a map-style Dataset"),
        (_Items([torch.zeros(3, IMG, IMG)] * 4), r"item 0 is a Tensor; expected \(image, label\)"),
        (_Items([(torch.zeros(3, IMG, IMG), 0.5)] * 4), "labels must be integers"),
        (_Items([(torch.zeros(3, IMG, IMG), "cat")] * 4), "labels must be integers"),
        (_Items([(torch.zeros(IMG, IMG), 0)] * 4), r"expected a \[channels, height, width\] tensor"),
        (TensorDataset(torch.zeros(4, 3, IMG, IMG), torch.full((4,), 0.5)), "labels must be integers"),
        (_Items([]), "empty"),
    ],
)
def test_a_wrong_analysis_set_fails_in_setup_in_one_line(tmp_path: Path, analysis: Any, match: str) -> None:
    callback = SpectralGeometryCallback(analysis=analysis, **FAST)
    fails_in_setup(tmp_path, Classifier(), callback, AnalysisSetError, match)


def test_an_unstratified_analysis_set_warns_once_naming_the_class_counts(tmp_path: Path) -> None:
    labels = torch.tensor([0] * 2 + [1] * 5 + [2] * 3)
    unstratified = TensorDataset(torch.randn(10, 3, IMG, IMG), labels)
    callback = SpectralGeometryCallback(analysis=unstratified, every_n_epochs=1, **FAST)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path, Classifier(), callback, epochs=2)
    notices = [str(w.message) for w in caught if "class-stratified" in str(w.message)]
    assert notices == [
        "[tgo] analysis set is not class-stratified: 3 classes, counts 2..5; build one with tgo.data.stratified_subset"
    ]
    assert recorded_epochs(tmp_path) == [0, 1, 2]


def test_settings_take_keyword_overrides_validated_like_the_config() -> None:
    dataset = images(8)
    assert SpectralGeometryCallback(analysis=dataset, every_n_epochs=5).settings.every_n_epochs == 5
    both = SpectralGeometryCallback(settings={"every_n_epochs": 3, "groups": 4}, every_n_epochs=7)
    assert (both.settings.every_n_epochs, both.settings.groups) == (7, 4)
    assert SpectralGeometryCallback(settings=ObservationSettings(gram_dtype="float32")).settings.gram_dtype == "float32"
    with pytest.raises(UserInputError, match=r"^observation\.every_n_epochs: expected a positive integer, got 0$"):
        SpectralGeometryCallback(analysis=dataset, every_n_epochs=0)
    with pytest.raises(UserInputError, match=r"^observation\.every_n_epoch: unknown setting; expected one of"):
        SpectralGeometryCallback(analysis=dataset, every_n_epoch=5)
    with pytest.raises(UserInputError, match="model=3"):
        SpectralGeometryCallback(analysis=dataset, model=3)


def test_a_datamodule_analysis_dataset_still_works_with_its_batch_size(tmp_path: Path) -> None:
    class UserData(L.LightningDataModule):
        analysis_batch_size = 5

        def __init__(self) -> None:
            super().__init__()
            self.analysis_dataset = stratified_subset(images(16), per_class=3)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(images(8, seed=1), batch_size=4)

    callback = SpectralGeometryCallback(**FAST)
    trainer(tmp_path, callback).fit(Classifier(), datamodule=UserData())
    assert callback._analysis_batch_size == 5 and recorded_epochs(tmp_path) == [0, 1]


def test_the_run_directory_refuses_foreign_geometry_files_and_a_second_fresh_training(tmp_path: Path) -> None:
    analysis = stratified_subset(images(8), per_class=2)
    foreign = tmp_path / "foreign"
    (foreign / "geometry").mkdir(parents=True)
    (foreign / "geometry" / "plot.png").write_bytes(b"mine")
    callback = SpectralGeometryCallback(analysis=analysis, **FAST)
    fails_in_setup(foreign, Classifier(), callback, RunDirectoryError, r"geometry/ holds files TGO did not make")
    assert (foreign / "geometry" / "plot.png").read_bytes() == b"mine"
    assert sorted(p.name for p in (foreign / "geometry").iterdir()) == ["plot.png"]

    fit(tmp_path / "run", Classifier(), SpectralGeometryCallback(analysis=analysis, **FAST))
    before = (tmp_path / "run" / "geometry" / "metrics.csv").read_bytes()
    again = SpectralGeometryCallback(analysis=analysis, **FAST)
    fails_in_setup(tmp_path / "run", Classifier(), again, RunDirectoryError, r"already holds the geometry records")
    assert (tmp_path / "run" / "geometry" / "metrics.csv").read_bytes() == before


def test_the_readme_snippet_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    val_set = images(40)
    snippet = """
from tgo.callbacks import SpectralGeometryCallback
from tgo.data import stratified_subset
analysis = stratified_subset(val_set, per_class=10, seed=0)  # any labelled Dataset of (image, label)
geometry = SpectralGeometryCallback(analysis=analysis, every_n_epochs=5)  # finds the timm ViT in your module
trainer = L.Trainer(max_epochs=20, callbacks=[geometry])
"""
    scope: dict[str, Any] = {"L": L, "val_set": val_set}
    exec(snippet, scope)
    assert len(scope["analysis"]) == 40 and scope["geometry"].settings.every_n_epochs == 5


# ----------------------------------------------------------------------------------------------------- find_vit
def test_find_vit_looks_through_compile_and_counts_a_shared_network_once() -> None:
    vit = tiny_vit()
    holder = nn.Module()
    holder.net = vit
    holder.fast = torch.compile(vit)  # type: ignore[assignment]  # a compiled handle of the same ViT
    assert find_vit(holder) == ("net", vit)
    wrapper = nn.Module()
    wrapper.only = torch.compile(tiny_vit())  # type: ignore[assignment]
    path, found = find_vit(wrapper)
    assert path == "only" and found is wrapper.only._orig_mod  # type: ignore[union-attr]
    assert find_vit(vit) == ("", vit)


# ----------------------------------------------------------------------------------------------------- subsets
def test_stratified_subset_follows_the_datamodule_rule_with_known_counts() -> None:
    labels = np.array([0] * 5 + [1] * 3 + [2] * 7)
    data = TensorDataset(torch.randn(15, 3, 4, 4), torch.as_tensor(labels))
    subset = stratified_subset(data, per_class=3, seed=7)
    assert subset.labels.dtype == np.int64 and subset.labels.tolist() == [0] * 3 + [1] * 3 + [2] * 3
    assert subset.indices == select_analysis_indices(list(range(15)), labels, 3, 3, 7)
    assert sorted(subset.indices[3:6]) == [5, 6, 7], "a class with exactly per_class items gives all of them"
    for i, parent in enumerate(subset.indices):
        assert torch.equal(subset[i][0], data[parent][0])
    assert subset.indices == stratified_subset(data, per_class=3, seed=7).indices, "deterministic by seed"
    assert subset.indices != stratified_subset(data, per_class=3, seed=8).indices
    with pytest.raises(AnalysisSetError, match=r"per_class=4 needs 4 items of every class, .* label 1 has 3"):
        stratified_subset(data, per_class=4)
    with pytest.raises(AnalysisSetError, match="per_class must be a positive integer"):
        stratified_subset(data, per_class=0)


def test_stratified_subset_reads_labels_from_targets_labels_or_the_items() -> None:
    class Torchvision(_Items):
        @property
        def targets(self) -> list[int]:
            return [int(y) for _, y in self.items]

    items = [(torch.zeros(3, 4, 4), c) for c in [3, 7, 3, 7, 3, 7]]  # labels need not be 0..K-1
    plain, torchvision = _Items(items), Torchvision(items)
    given = stratified_subset(plain, per_class=2, labels=[3, 7, 3, 7, 3, 7])
    assert stratified_subset(plain, per_class=2).indices == stratified_subset(torchvision, per_class=2).indices
    assert given.indices == stratified_subset(plain, per_class=2).indices and given.classes == [3, 7]
    nested = stratified_subset(stratified_subset(torchvision, per_class=3), per_class=1)  # a Subset of a Subset
    assert nested.labels.tolist() == [3, 7]
    with pytest.raises(AnalysisSetError, match="6 labels for 5 items"):
        dataset_labels(_Items(items[:5]), labels=[0] * 6)


def test_the_datamodule_default_matches_the_yaml_ten_per_class() -> None:
    assert TGODataModule(source="synthetic", num_classes=3, image_size=8).analysis_per_class == 10
    sized = TGODataModule(source="synthetic", num_classes=3, image_size=8, analysis_size=6)
    assert (sized.analysis_size, sized.analysis_per_class) == (6, None)


# ----------------------------------------------------------------------------------------------------- observe_model
def _observe_directly(net: nn.Module, dataset: Any, settings: ObservationSettings, root: Path, batch_size: int) -> Any:
    return observe_and_record(
        net,
        dataset,
        points_from_config(settings.points, net),
        settings=settings,
        plan=ShardPlan(batch_size=batch_size),
        record=RecordPlan(writer=RecordWriter(root), epoch=0, step=0, with_covariance=True),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )


def test_observe_model_equals_observe_and_record_bitwise_and_writes_nothing_without_out(tmp_path: Path) -> None:
    analysis = stratified_subset(images(24), per_class=3)
    net = tiny_vit().train()
    settings = ObservationSettings.from_config({"groups": 3})
    results = tgo.observe_model(net, analysis, groups=3)
    assert all(m.training for m in net.modules()), "train mode restored"
    direct = _observe_directly(net, analysis, settings, tmp_path, batch_size=64)
    assert list(results) == list(direct)
    for key, result in results.items():
        assert np.array_equal(result.spectrum.eigenvalues, direct[key].spectrum.eigenvalues, equal_nan=True), key
        assert result.observables.keys() == direct[key].observables.keys()
        for metric, value in result.observables.items():
            other = direct[key].observables[metric]
            assert value == other or (np.isnan(value) and np.isnan(other)), (key, metric)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["geometry"], "only the direct call wrote"


def test_observe_model_records_a_trajectory_and_refuses_an_epoch_already_recorded(tmp_path: Path) -> None:
    module = Classifier("encoder")  # any module holding one ViT
    analysis = DataLoader(stratified_subset(images(16), per_class=2), batch_size=4)
    tgo.observe_model(module, analysis, out=tmp_path, epoch=0, **FAST)
    tgo.observe_model(module, analysis, out=tmp_path, epoch=3, step=12, **FAST)
    assert recorded_epochs(tmp_path) == [0, 3]
    assert {row["step"] for row in read_metric_rows(tmp_path) if row["epoch"] == "3"} == {"12"}
    before = (tmp_path / "geometry" / "metrics.csv").read_bytes()
    already = r"^observe_model: epoch 3 is already recorded in .*\(recorded: \[0, 3\]\)"
    with pytest.raises(RunDirectoryError, match=already):
        tgo.observe_model(module, analysis, out=tmp_path, epoch=3, **FAST)
    other = stratified_subset(images(16, seed=9), per_class=2)
    with pytest.raises(RunDirectoryError, match="holds records of another analysis set"):
        tgo.observe_model(module, other, out=tmp_path, epoch=4, **FAST)
    assert (tmp_path / "geometry" / "metrics.csv").read_bytes() == before
    with pytest.raises(ModelLookupError, match="found no timm Vision Transformer in the model"):
        tgo.observe_model(nn.Linear(2, 2), analysis)


def test_observe_model_equals_the_callbacks_epoch_zero_record_for_the_same_weights(tmp_path: Path) -> None:
    """Default settings (probes and jackknife on): the callback's record of the initial weights and ``observe_model``
    on a copy of them are the same numbers, every metric string and every spectra array."""
    analysis = DataLoader(stratified_subset(images(32), per_class=4), batch_size=8)
    module = Classifier("backbone", seed=3)
    initial = copy.deepcopy(module)
    fit(tmp_path / "fit", module, SpectralGeometryCallback(analysis=analysis, figures={"heatmaps": False}))
    tgo.observe_model(initial, analysis, out=tmp_path / "plain", epoch=0)
    training_only = {o.name for o in NOISE_SCALE.observables}  # gradients between observations: none offline
    rows = {
        name: [r for r in read_metric_rows(tmp_path / name) if r["epoch"] == "0" and r["metric"] not in training_only]
        for name in ("fit", "plain")
    }
    assert rows["fit"] == rows["plain"] and len(rows["fit"]) > 100
    fit_spectra, plain_spectra = (load_spectra(tmp_path / name)[0] for name in ("fit", "plain"))
    assert fit_spectra.keys() == plain_spectra.keys()
    for point, arrays in fit_spectra.items():
        assert arrays.keys() == plain_spectra[point].keys(), point
        for name, array in arrays.items():
            assert np.array_equal(array, plain_spectra[point][name], equal_nan=True), (point, name)
    fit_manifest, plain_manifest = (
        RunDir(tmp_path / name).manifest.read_text(encoding="utf-8") for name in ("fit", "plain")
    )
    assert json.loads(fit_manifest)["fingerprint"] == json.loads(plain_manifest)["fingerprint"]


def test_import_tgo_stays_light() -> None:
    code = "import sys, tgo, tgo.callbacks; assert 'torch' not in sys.modules and 'lightning' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_training_entry_point_imports_lightning_and_timm_only_to_train() -> None:
    """A wrong config value, a missing GPU or a foreign run directory is one line after torch's import, not after
    Lightning's and timm's (several seconds more): ``tgo.train`` and what it imports at the top leave them out."""
    code = (
        "import sys, tgo.train, tgo.launch, tgo.resume, tgo.config\n"
        "late = sorted(m for m in ('lightning', 'pytorch_lightning', 'timm') if m in sys.modules)\n"
        "assert not late, late"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_user_run_resumed_from_its_checkpoint_continues_its_records(tmp_path: Path) -> None:
    analysis = stratified_subset(images(8), per_class=2)

    def run(epochs: int, ckpt_path: str | None) -> None:
        t = L.Trainer(
            max_epochs=epochs,
            default_root_dir=tmp_path,
            callbacks=[SpectralGeometryCallback(analysis=analysis, every_n_epochs=1, **FAST)],
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_train_batches=1,
            limit_val_batches=0,
        )
        t.fit(Classifier(), DataLoader(images(8, seed=1), batch_size=4), ckpt_path=ckpt_path)

    run(1, None)
    (checkpoint,) = (tmp_path / "checkpoints").glob("*.ckpt")
    run(2, str(checkpoint))
    assert recorded_epochs(tmp_path) == [0, 1, 2]
