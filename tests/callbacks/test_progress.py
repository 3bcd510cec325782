"""Feedback on the callback's slow steps (issue 37, item 3), by Lightning's progress-bar conventions.

Specification:

* the analysis pass shows a bar of its batches, on stdout like Lightning's bars, when the trainer shows
  ``TQDMProgressBar``; gone when it is done (``leave=False``);
* with the trainer's progress bar off, nothing of it is printed; with another progress bar (Rich, a user's own) a
  start line per observation instead of a foreign bar;
* the stream calls its progress before the first batch and after each one, with the number of batches;
* the one-time imports and solver set-up are timed at setup and reported once per process;
* the end of a fit says what it waits for (the summary still running, the TensorBoard figures), then how long.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import lightning as L
import pytest
import timm
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ProgressBar
from torch.utils.data import DataLoader, TensorDataset

import tgo.callbacks.spectral_geometry as geometry_module
from tgo.callbacks import SpectralGeometryCallback
from tgo.callbacks.background import BackgroundLane, waiting_for
from tgo.data import stratified_subset
from tgo.observatory import vit_points
from tgo.observatory import warmup as warmup_module
from tgo.observatory.settings import ObservationSettings
from tgo.observatory.stream import stream_activations
from tgo.progress import LoopProgress, terminal_progress, timed_wait

CLASSES, IMG = 4, 16
FAST: dict[str, Any] = {"groups": 2, "probes": {"folds": 2}, "figures": {"heatmaps": False}, "every_n_epochs": 1}


def _images(n: int, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, IMG, IMG, generator=generator), torch.arange(n) % CLASSES)


def _vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=IMG, patch_size=4, depth=2, embed_dim=16, num_heads=2, num_classes=CLASSES
    )


class _Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = _vit()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.backbone(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _LineBar(ProgressBar):
    """A progress bar that is not Lightning's tqdm one (as ``RichProgressBar``): no foreign bar must cut into it."""

    def disable(self) -> None:
        pass


def _fit(
    root: Any, *, background: bool = False, callbacks: tuple[L.Callback, ...] = (), **trainer_options: Any
) -> SpectralGeometryCallback:
    """One epoch, observed at epochs 0 and 1: 16 analysis images in batches of 4, so each pass is 4 batches."""
    callback = SpectralGeometryCallback(
        analysis=stratified_subset(_images(16), per_class=4), batch_size=4, summary={"background": background}, **FAST
    )
    options: dict[str, Any] = dict(
        max_epochs=1,
        default_root_dir=root,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_train_batches=1,
        limit_val_batches=0,
    )
    trainer = L.Trainer(callbacks=[callback, *callbacks], **{**options, **trainer_options})
    trainer.fit(_Classifier(), DataLoader(_images(8, seed=1), batch_size=4))
    return callback


@pytest.fixture
def info(caplog) -> pytest.LogCaptureFixture:
    """Captures the lines Lightning's ``rank_zero_info`` logs (its logger: INFO), read in ``info.messages``."""
    caplog.set_level(logging.INFO)
    return caplog


def test_the_pass_shows_a_bar_of_its_batches_with_lightnings_tqdm_bar(tmp_path, capfd):
    _fit(tmp_path, enable_progress_bar=True)
    out = capfd.readouterr().out
    assert "Geometry of epoch 0" in out and "Geometry of epoch 1" in out
    assert "4/4" in out  # the analysis set's batches, counted


def test_without_a_progress_bar_nothing_of_the_pass_is_printed(tmp_path, capfd, info):
    _fit(tmp_path, enable_progress_bar=False)
    captured = capfd.readouterr()
    assert "Geometry of" not in captured.out + captured.err
    assert not [line for line in info.messages if line.endswith(" ...")]


def test_another_progress_bar_gets_a_start_line_per_observation_instead_of_a_bar(tmp_path, capfd, info):
    _fit(tmp_path, callbacks=(_LineBar(),))
    assert "[tgo] geometry of epoch 0 ..." in info.messages and "[tgo] geometry of epoch 1 ..." in info.messages
    assert "Geometry of" not in capfd.readouterr().out


def test_the_stream_reports_each_batch_with_the_number_of_batches():
    net = _vit()
    calls: list[tuple[int, int | None]] = []
    loader = DataLoader(_images(10), batch_size=4)  # 4 + 4 + 2
    stream_activations(net, loader, vit_points(net)[:2], progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]
    calls.clear()
    batches = (batch for batch in loader)  # a generator does not know its length
    stream_activations(net, batches, vit_points(net)[:2], progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, None), (1, None), (2, None), (3, None)]


def test_the_one_time_setup_is_timed_and_reported_once_per_process(tmp_path, monkeypatch, info):
    monkeypatch.setattr(warmup_module, "_warmed", set())  # as in a fresh process
    _fit(tmp_path / "a", enable_progress_bar=False)
    _fit(tmp_path / "b", enable_progress_bar=False)
    one_time = [line for line in info.messages if "one-time imports and solver set-up in" in line]
    assert len(one_time) == 1
    monkeypatch.setattr(warmup_module, "_warmed", set())
    settings = ObservationSettings.from_config({"topology": {"enabled": True}})
    assert warmup_module.warm_up(settings) is not None
    assert warmup_module.warm_up(settings) is None  # nothing left to warm
    assert {"ripser", "persim"} <= warmup_module._warmed  # the enabled family's lazy imports


def _fit_holding_summary(tmp_path, monkeypatch, epoch: int) -> list[str]:
    """A background fit observing epochs 0 and 1 whose summary of ``epoch`` runs only once the training thread has
    said it waits for it; the ``[tgo]`` lines said."""
    lines: list[str] = []
    waiting = threading.Event()
    real_summary = geometry_module.summarize_and_record

    def say(line: str) -> None:
        lines.append(line)
        if line == f"[tgo] waiting for the summary of epoch {epoch} ...":
            waiting.set()

    def held_summary(reduced, **kwargs):
        if reduced.record.epoch == epoch:
            assert waiting.wait(120), f"nothing said it waits for the summary of epoch {epoch}"
        return real_summary(reduced, **kwargs)

    monkeypatch.setattr(geometry_module, "rank_zero_info", say)
    monkeypatch.setattr(geometry_module, "summarize_and_record", held_summary)
    callback = _fit(tmp_path, background=True, enable_progress_bar=False)
    assert callback.observed_epochs == [0, 1]
    return lines


def test_the_end_of_a_fit_says_what_it_waits_for_and_how_long_it_took(tmp_path, monkeypatch):
    lines = _fit_holding_summary(tmp_path, monkeypatch, epoch=1)  # the last epoch's: the end of the fit waits
    assert "[tgo] waiting for the summary of epoch 1 ..." in lines
    assert any(line.startswith("[tgo] the summary of epoch 1 finished in ") for line in lines)


def test_an_observation_that_waits_for_the_summary_before_says_so_and_how_long_it_took(tmp_path, monkeypatch):
    lines = _fit_holding_summary(tmp_path, monkeypatch, epoch=0)  # epoch 1's observation waits for it
    finished = [i for i, line in enumerate(lines) if line.startswith("[tgo] the summary of epoch 0 finished in ")]
    assert finished and finished[0] > lines.index("[tgo] waiting for the summary of epoch 0 ...")


def test_waiting_for_names_a_running_summary_and_the_figures_it_brings():
    lane, release = BackgroundLane(1, name="tgo-summary", collect=True), threading.Event()
    assert waiting_for(lane, 0, tensorboard=True) is None
    lane.submit(lambda: release.wait(120), label="summary of epoch 3", epoch=3)
    assert waiting_for(lane, 0, tensorboard=False) == "the summary of epoch 3"
    assert waiting_for(lane, 0, tensorboard=True) == "the summary of epoch 3 and the TensorBoard figures"
    release.set()
    lane.result(120)
    assert waiting_for(lane, 2, tensorboard=True) == "the TensorBoard figures"
    lane.close()


def test_a_loop_progress_bar_and_its_lines():
    import io

    lines: list[str] = []
    with LoopProgress("geometry of epoch 2", say=lines.append) as progress:  # no bar: the start line
        progress(1, 2)
    assert lines == ["geometry of epoch 2 ..."]
    with timed_wait("the figures", lines.append):
        pass
    assert lines[1] == "waiting for the figures ..." and lines[2].startswith("the figures finished in ")

    stream = io.StringIO()
    with terminal_progress("observing model.ckpt", file=stream, enabled=True) as progress:
        for done in range(4):
            progress(done, 3)
    assert "observing model.ckpt" in stream.getvalue() and "3/3" in stream.getvalue()
    quiet = io.StringIO()
    with terminal_progress("observing model.ckpt", file=quiet) as progress:  # not a terminal: no bar
        progress(0, 3)
    assert quiet.getvalue() == ""
