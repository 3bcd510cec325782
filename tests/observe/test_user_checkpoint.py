"""A checkpoint of the user's own LightningModule (a timm ViT as ``self.backbone``) is observable offline.

The checkpoints are saved by a real ``lightning.Trainer`` after one tiny epoch. The user says the timm model and its
arguments (``--timm NAME`` with ``model.arch.*``); the prefix of the ViT's weights in the state dict is found when
one prefix holds exactly the model's keys, can be given with ``--prefix``, and an ambiguous or wrong one is a
one-line error. The file is read with ``weights_only=True``.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import TINY_TIMM as TINY
from tgo.checkpoints import CheckpointError, CheckpointMismatchError, UnsafeCheckpointError
from tgo.observe import ObserveError, main
from tgo.observe import observe_models as observe
from tgo.records import load_spectra, read_metric_rows

NAME = "vit_tiny_patch16_224"
TINY_TIMM = [*TINY, "data=digits"]  # a checkpoint outside a TGO run names its data
ARCH = dict(img_size=16, patch_size=4, depth=2, embed_dim=16, num_heads=2)  # what TINY_TIMM says on the command line


class UserModule(L.LightningModule):
    """How a user writes it: a timm backbone, their own classifier (and, for the ambiguous case, an EMA copy)."""

    def __init__(self, with_ema: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = timm.create_model(NAME, num_classes=0, **ARCH)
        self.classifier = nn.Linear(16, 10)
        self.ema = timm.create_model(NAME, num_classes=0, **ARCH) if with_ema else None

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.classifier(self.backbone(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp: Path, with_ema: bool = False) -> tuple[Path, UserModule]:
    torch.manual_seed(0)
    module = UserModule(with_ema)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8, 3, 16, 16, generator=g), torch.arange(8) % 10)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp,
    )
    trainer.fit(module, DataLoader(data, batch_size=4))
    path = tmp / ("ema.ckpt" if with_ema else "user.ckpt")
    trainer.save_checkpoint(path)
    return path, module


@pytest.fixture(scope="module")
def user_ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, UserModule]:
    return _fit(tmp_path_factory.mktemp("user"))


def test_the_prefix_is_found_and_the_trained_weights_are_observed(
    user_ckpt: tuple[Path, UserModule], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path, module = user_ckpt
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    assert "backbone.blocks.0.attn.qkv.weight" in state and "classifier.weight" in state  # what users' files hold
    out = tmp_path / "auto"
    assert main(["--checkpoint", str(path), "--timm", NAME, "--out", str(out), *TINY_TIMM]) == 0
    err = capsys.readouterr().err
    assert f"observed user.ckpt ({NAME}, weights under 'backbone.') as epoch 1 (5 points, " in err
    assert "(point, view) records)" in err
    spectra = load_spectra(out)
    assert list(spectra) == [1]  # one completed epoch
    assert list(spectra[1]) == ["patch_embed", "pos_embed", "block_01", "block_02", "cls"]
    explicit = tmp_path / "explicit"
    observe(checkpoint=str(path), timm_name=NAME, prefix="backbone.", out=explicit, overrides=TINY_TIMM)
    # The trained backbone's weights: the same as a weights file of module.backbone, and not a random init.
    weights = tmp_path / "backbone.pth"
    torch.save(module.backbone.state_dict(), weights)
    by_file, by_random = tmp_path / "file", tmp_path / "random"
    observe(timm_name=NAME, weights=str(weights), epoch=1, out=by_file, overrides=TINY_TIMM)
    observe(timm_name=NAME, epoch=1, out=by_random, overrides=TINY_TIMM)
    auto = load_spectra(out)[1]
    for other in (explicit, by_file):
        for point, arrays in load_spectra(other)[1].items():
            np.testing.assert_array_equal(arrays["eigenvalues"], auto[point]["eigenvalues"])
    assert not np.array_equal(load_spectra(by_random)[1]["block_01"]["eigenvalues"], auto["block_01"]["eigenvalues"])
    rows = read_metric_rows(out)
    assert {r["point"] for r in rows} == set(spectra[1]) and len({r["view"] for r in rows}) > 1


def test_a_trajectory_of_user_checkpoints(user_ckpt: tuple[Path, UserModule], tmp_path: Path):
    path, _ = user_ckpt
    directory = tmp_path / "ckpts"
    directory.mkdir()
    (directory / "user.ckpt").write_bytes(path.read_bytes())
    (source,) = observe(checkpoints=str(directory), timm_name=NAME, out=tmp_path / "o", overrides=TINY_TIMM)
    assert source.epoch == 1


def test_ambiguous_wrong_and_misfitting_prefixes_are_one_line_errors(
    user_ckpt: tuple[Path, UserModule], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path, _ = user_ckpt
    ema, _ = _fit(tmp_path, with_ema=True)
    with pytest.raises(CheckpointError, match=r"under 2 prefixes \('backbone\.', 'ema\.'\); say which with --prefix"):
        observe(checkpoint=str(ema), timm_name=NAME, out=tmp_path / "a", overrides=TINY_TIMM)
    observe(checkpoint=str(ema), timm_name=NAME, prefix="ema.", out=tmp_path / "b", overrides=TINY_TIMM)
    with pytest.raises(CheckpointError, match=r"no key of its state dict starts with --prefix 'net\.'.*'backbone\.'"):
        observe(checkpoint=str(path), timm_name=NAME, prefix="net.", out=tmp_path / "c", overrides=TINY_TIMM)
    deeper = [*TINY_TIMM, "model.arch.depth=3"]  # the user's model has 2 blocks
    with pytest.raises(CheckpointMismatchError, match=r"no prefix holds exactly.*'backbone\.' \(.*missing blocks\.2"):
        observe(checkpoint=str(path), timm_name=NAME, out=tmp_path / "d", overrides=deeper)
    with pytest.raises(CheckpointMismatchError, match=r"weights under 'backbone\.'.*missing keys: blocks\.2"):
        observe(checkpoint=str(path), timm_name=NAME, prefix="backbone.", out=tmp_path / "e", overrides=deeper)
    capsys.readouterr()
    for argv in (
        ["--checkpoint", str(ema), "--timm", NAME],
        ["--checkpoint", str(path), "--timm", NAME, "--prefix", "net."],
        ["--checkpoint", str(path), "--timm", NAME, "--out", str(tmp_path / "x"), *deeper],
        ["--checkpoint", str(path)],  # no --timm: says how to name the model
        ["--checkpoint", str(path), "--prefix", "backbone."],
        ["--timm", "resnet18"],
    ):
        full = argv if "--out" in argv else [*argv, "--out", str(tmp_path / "x"), *TINY_TIMM]
        assert main(full) == 2, argv
        message = capsys.readouterr().err.strip()
        assert message.startswith("tgo.observe: error: ") and "\n" not in message, message
        if argv == ["--checkpoint", str(path)]:
            assert "add --timm NAME" in message
        if argv[-1] == "resnet18":
            assert "only timm Vision Transformers are supported" in message and "img_size" not in message
    with pytest.raises(ObserveError, match="--run reads a TGO run"):
        observe(run=str(tmp_path), timm_name=NAME, out=tmp_path / "y")
    with pytest.raises(ObserveError, match="only apply to --timm NAME without a checkpoint"):
        observe(checkpoint=str(path), timm_name=NAME, weights=str(path), out=tmp_path / "y")


def test_a_checkpoint_outside_a_tgo_run_must_name_its_data(
    user_ckpt: tuple[Path, UserModule], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path, _ = user_ckpt
    for source in (["--checkpoint", str(path)], ["--checkpoints", str(path.parent)]):
        out = tmp_path / "o"
        assert main([*source, "--timm", NAME, "--out", str(out), *TINY]) == 2, source  # data.* tweaks TGO's digits
        message = capsys.readouterr().err.strip()
        assert message.startswith(f"tgo.observe: error: {source[1]}: not in a TGO run") and "\n" not in message
        assert "data=imagefolder data.root=DIR" in message and not out.exists(), "refused before any work"


def test_user_checkpoints_are_read_without_running_them(tmp_path: Path):
    class Payload:
        def __reduce__(self):
            return (print, ("unpickled!",))

    bad = tmp_path / "evil.ckpt"
    torch.save({"epoch": 0, "state_dict": {"backbone.x": torch.zeros(1)}, "extra": Payload()}, bad)
    with pytest.raises(UnsafeCheckpointError, match="print"):
        observe(checkpoint=str(bad), timm_name=NAME, out=tmp_path / "o", overrides=TINY_TIMM)
