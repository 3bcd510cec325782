"""``run_description.json`` (issue 37 item 2): a user's own Lightning training and ``tgo.observe_model`` describe their
run, so the report's header is filled whatever the entry point; a malformed description is refused in one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import timm
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tgo
from tgo.callbacks import SpectralGeometryCallback
from tgo.data import stratified_subset
from tgo.observatory.standalone import RunDirectoryError
from tgo.report.runinfo import NOT_RECORDED, read_run_info
from tgo.report.runs import load_run_data
from tgo.report.sections import header_rows
from tgo.run_description import (
    OFFLINE_OBSERVATION,
    TRAINING_RUN,
    RunDescriptionError,
    description_path,
    read_description,
    validation_metrics,
)

CLASSES, IMG, DEPTH, WIDTH, HEADS, PATCH = 4, 16, 2, 16, 2, 4
FAST: dict[str, Any] = {"probes": {"enabled": False}, "groups": 2, "figures": {"heatmaps": False}}


def tiny_vit() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=IMG, patch_size=PATCH, depth=DEPTH, embed_dim=WIDTH,
        num_heads=HEADS, num_classes=CLASSES,
    )  # fmt: skip


def images(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, IMG, IMG, generator=generator), torch.arange(n) % CLASSES)


class Classifier(L.LightningModule):
    """A user's own module logging its validation metrics under its own names (``val_acc``, ``val_acc_top5``)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = tiny_vit()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        top5 = (logits.topk(min(5, CLASSES), dim=1).indices == y[:, None]).any(dim=1).float().mean()
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())
        self.log("val_acc_top5", top5)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


@pytest.fixture(scope="module")
def own_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, L.Trainer]]:
    """Two epochs of a user's own training, seeded by Lightning, with a CSV logger and the callback."""
    root = tmp_path_factory.mktemp("own")
    analysis = stratified_subset(images(24, 0), per_class=3)
    callback = SpectralGeometryCallback(analysis=analysis, every_n_epochs=1, **FAST)
    trainer = L.Trainer(
        max_epochs=2,
        default_root_dir=root,
        callbacks=[callback],
        accelerator="cpu",
        logger=CSVLogger(root),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=2,
    )
    with pytest.MonkeyPatch.context() as patch:  # PL_GLOBAL_SEED, set by seed_everything, is this fixture's alone
        patch.delenv("PL_GLOBAL_SEED", raising=False)
        L.seed_everything(3)
        trainer.fit(Classifier(), DataLoader(images(8, 1), batch_size=4), DataLoader(images(8, 2), batch_size=8))
    # the records' directory: the default_root_dir, or the logger's version directory where the callback records there
    records = next(p.parent for p in sorted(root.rglob("geometry")) if (p / "metrics.csv").is_file())
    yield records, trainer


def test_a_users_own_training_is_described_as_it_ran(own_run: tuple[Path, L.Trainer]) -> None:
    root, trainer = own_run
    described = read_description(root)
    assert described is not None and described["kind"] == TRAINING_RUN
    assert described["model"] == {
        "name": "vit_tiny_patch16_224",
        "class": "timm.models.vision_transformer.VisionTransformer",
        "depth": DEPTH,
        "width": WIDTH,
        "heads": HEADS,
        "patch": PATCH,
        "image_size": IMG,
        "parameters": sum(p.numel() for p in trainer.lightning_module.encoder.parameters()),
    }
    assert described["data"] == {
        "analysis_source": "TensorDataset",
        "analysis_images": 12,
        "training_source": "TensorDataset",
        "training_images": 8,
        "validation_images": 8,
    }
    schedule = described["schedule"]
    assert (schedule["planned_epochs"], schedule["completed_epochs"], schedule["global_step"]) == (2, 2, 4)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert described["validation"]["metrics"] == logged and set(logged) == {"val_loss", "val_acc", "val_acc_top5"}
    assert (described["validation"]["epoch"], described["validation"]["step"]) == (2, 4)
    assert described["seed"] == 3  # L.seed_everything(3)
    assert described["versions"]["torch"] in {torch.__version__, torch.__version__.split("+")[0]}
    assert described["versions"]["lightning"] == L.__version__ and described["versions"]["timm"] == timm.__version__


def test_the_report_header_of_a_users_own_training_has_every_field(own_run: tuple[Path, L.Trainer]) -> None:
    root, trainer = own_run
    info = read_run_info(root)
    rows = dict(header_rows([load_run_data(root)], [info]))
    empty = [name for name, value in rows.items() if NOT_RECORDED in value and name != "git commit (report)"]
    assert empty == ["git commit (run)"], empty  # a user's script has no TGO commit to record
    assert rows["model"] == (
        f"ViT, {DEPTH} blocks, width {WIDTH}, {HEADS} heads, patch {PATCH}, {IMG} px images "
        "(VisionTransformer, timm vit_tiny_patch16_224)"
    )
    assert rows["kind"] == TRAINING_RUN and rows["epochs (planned)"] == "2" and rows["seed(s)"] == "3"
    assert rows["data source"] == "TensorDataset (8 training images, 8 validation images)"
    assert rows["image size"] == str(IMG) and rows["epochs observed"] == "0, 1, 2 (3 observations)"
    metrics = trainer.callback_metrics
    assert rows["final val top-1"] == f"{float(metrics['val_acc']):.2%}"
    assert rows["final val top-5"] == f"{float(metrics['val_acc_top5']):.2%}"
    assert rows["validation metrics (last logged)"].startswith("after epoch 2: val_acc=")
    assert rows["parameters"] == f"{info.parameters:,}" and "lightning " in rows["software (run)"]


def test_observe_model_output_is_labelled_an_offline_observation(tmp_path: Path) -> None:
    tgo.observe_model(tiny_vit(), stratified_subset(images(8, 0), per_class=2), out=tmp_path, epoch=5, **FAST)
    described = read_description(tmp_path)
    assert described is not None and described["kind"] == OFFLINE_OBSERVATION
    assert described["schedule"] == {"observed_epoch": 5, "global_step": 0}
    rows = dict(header_rows([load_run_data(tmp_path)], [read_run_info(tmp_path)]))
    assert rows["kind"] == OFFLINE_OBSERVATION and rows["epochs (planned)"] == "n/a (offline observation)"
    assert rows["model"].startswith(f"ViT, {DEPTH} blocks, width {WIDTH}") and rows["image size"] == str(IMG)
    assert rows["observed model(s)"] == "vit_tiny_patch16_224 (tgo.observe_model, weights of epoch 5)"
    assert rows["data source"] == "TensorDataset (the analysis set; the training data is not known)"


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "is not JSON"),
        ('["a list"]', "is not a run description"),
        ('{"tgo": "run description", "kind": "a guess"}', "kind is 'a guess'"),
        ('{"tgo": "run description", "kind": "training run", "entry": 3}', "entry is 3"),
        ('{"tgo": "run description", "kind": "training run", "model": []}', "model is list, not an object"),
        ('{"tgo": "run description", "kind": "training run", "model": {"depth": "two"}}', "model.depth is 'two'"),
        ('{"tgo": "run description", "kind": "training run", "validation": {"metrics": {"a": "x"}}}', "metrics"),
    ],
)
def test_a_malformed_description_is_refused_in_one_line(tmp_path: Path, content: str, match: str) -> None:
    description_path(tmp_path).write_text(content, encoding="utf-8")
    with pytest.raises(RunDescriptionError, match=match) as caught:
        read_description(tmp_path)
    assert "\n" not in str(caught.value) and "run_description.json" in str(caught.value)


def test_a_description_tgo_did_not_write_is_never_overwritten(tmp_path: Path) -> None:
    description_path(tmp_path).write_text('{"mine": 1}\n', encoding="utf-8")
    with pytest.raises(RunDirectoryError, match="never overwrites a file it did not create") as caught:
        tgo.observe_model(tiny_vit(), stratified_subset(images(8, 0), per_class=2), out=tmp_path, **FAST)
    assert "\n" not in str(caught.value)
    assert json.loads(description_path(tmp_path).read_text(encoding="utf-8")) == {"mine": 1}


def test_validation_metrics_are_told_from_training_ones_and_accuracies_read_by_name(tmp_path: Path) -> None:
    logged = {"val_acc": torch.tensor(0.5), "eval/loss": 2.0, "train_loss": 1.0, "interval": 3}
    logged["val_features"] = torch.ones(2)
    assert validation_metrics(logged) == {"eval/loss": 2.0, "val_acc": 0.5}  # a vector is no scalar metric
    metrics = {"val_acc_step": 0.1, "val_acc_epoch": 0.2, "val/accuracy_top5": 0.9, "val_loss": 1.5, "val_acc_pct": 55}
    description = {"tgo": "run description", "kind": TRAINING_RUN, "validation": {"metrics": metrics}}
    description_path(tmp_path).write_text(json.dumps(description), encoding="utf-8")
    info = read_run_info(tmp_path)
    assert (info.top1, info.top5) == (0.2, 0.9)  # the epoch mean before the step's; 55 is no fraction
    assert info.kind == TRAINING_RUN and info.validation == metrics and info.model is None
