"""The background lane (`tgo.callbacks.background.BackgroundLane`) and the two kinds of work the callback runs on it.

Specification:

* the lane runs jobs in order, at most N in flight: a figure lane waits for room, pauses while held (between a
  generator job's steps) without deadlocking, and warns about a failing job without stopping; a summary lane
  (``collect``) runs one at a time, hands its result or its exception back, and refuses a second;
* on Linux a lane's jobs run at a nice value raised by ``nice`` (the callback's: `BACKGROUND_NICE`), and so do the
  threads they start (the summary's pool), while the caller's priority is untouched;
* every figure is written before ``fit`` returns, and those of completed observations when training raises;
* in a fit, ``geometry/blocking_seconds`` excludes the summary, and every observation's records are written before
  ``fit`` returns, identical to the records of the same fit with ``summary.background=false``;
* when training raises, the summary in flight is still recorded before ``fit`` re-raises;
* a checkpoint of later weights waits for the summary in flight; a checkpoint of the observed weights lists the
  epoch as pending, and a resume from it observes that epoch again when its records are missing, giving the same
  records.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset

import tgo.callbacks.spectral_geometry as geometry_module
from tests.conftest import compose_train
from tests.helpers import SimulatedCrash
from tgo import viz
from tgo.callbacks import SpectralGeometryCallback
from tgo.callbacks.background import BACKGROUND_NICE, BackgroundLane
from tgo.data import stratified_subset
from tgo.records import RunDir, load_spectra, read_metric_rows, recorded_epochs
from tgo.resume import observed_in_checkpoint, set_aside_epochs
from tgo.safe_load import load_weights_only
from tgo.train import run

SUMMARY_DELAY_S = 0.3
FAST: dict[str, Any] = {"groups": 2, "probes": {"folds": 2}, "figures": {"heatmaps": False}, "every_n_epochs": 1}
NO_STEPS: dict[str, list[int]] = {"observed_steps": [], "pending_steps": []}  # no step series (observation.early)


QUICK = [
    "experiment=smoke",
    "trainer.limit_train_batches=1",
    "trainer.limit_val_batches=1",
    "observation.figures.heatmaps=false",
    "observation.figures.histograms=false",  # the kinds FIGURES checks stay on (the smoke experiment leaves the
    "observation.every_n_epochs=1",  # story, profiles, bands and attention cards out)
]
FIGURES = ("spectra/00_patch_embed", "spectra/06_cls", "decay/all_points", "layer_epoch/effective_rank")
"""A few of each kind of figure (one spectra card per point, one layer x epoch card per observable)."""


def events(run_dir: Path) -> EventAccumulator:
    return EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0, "scalars": 0}).Reload()


@pytest.fixture
def slow_rendering(monkeypatch):
    """Rendering takes long enough that figures are still in flight when training ends, unless someone waits."""
    render = viz.render_rgb

    def slow(fig):
        time.sleep(0.3)
        return render(fig)

    monkeypatch.setattr(viz, "render_rgb", slow)


# ----------------------------------------------------------------------------------------------------- the lane
def test_a_lane_runs_jobs_in_order_and_bounds_the_jobs_in_flight():
    worker = BackgroundLane(2)
    gate = threading.Event()
    done: list[int] = []

    def job(i: int):
        def run_job() -> None:
            gate.wait(5)
            done.append(i)

        return run_job

    worker.submit(job(0))
    worker.submit(job(1))
    assert worker.in_flight == 2
    blocked = threading.Thread(target=worker.submit, args=(job(2),))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive(), "a third job waits while two are in flight"
    assert not worker.wait(timeout=0.05)
    gate.set()
    blocked.join(5)
    assert worker.close(timeout=5)
    assert done == [0, 1, 2] and worker.completed == 3
    worker.submit(job(3))  # a closed lane starts a new thread
    assert worker.close(timeout=5) and done == [0, 1, 2, 3]


def test_a_held_lane_pauses_between_steps_and_a_full_submit_does_not_deadlock():
    worker = BackgroundLane(1)
    started, steps = threading.Event(), []

    def job():
        started.set()
        steps.append(1)
        yield
        steps.append(2)

    with worker.held():
        worker.submit(job)
        time.sleep(0.2)
        assert not started.is_set(), "no job starts while held"
    assert worker.wait(timeout=5) and steps == [1, 2]
    gate = threading.Event()
    worker.submit(lambda: gate.wait(5))
    with worker.held():
        threading.Timer(0.2, gate.set).start()
        assert worker.submit(job).waited > 0.1, "waited for room, the worker ran meanwhile"
        time.sleep(0.2)
        assert steps == [1, 2], "held again once the job is queued"
    assert worker.close(timeout=5) and steps == [1, 2, 1, 2]


def test_a_failing_job_warns_and_the_next_one_still_runs():
    worker = BackgroundLane(2)
    done: list[str] = []

    def boom() -> None:
        raise ValueError("bad figure")

    with pytest.warns(RuntimeWarning, match="bad figure"):
        worker.submit(boom, label="boom")
        worker.submit(lambda: done.append("ok"))
        assert worker.close(timeout=5)
    assert done == ["ok"] and [label for label, _ in worker.failures] == ["boom"]


def test_an_idle_lane_pickles_as_its_settings_and_a_busy_one_refuses(tmp_path):
    """``ddp_spawn`` pickles the callback with its lanes: an idle lane travels as its settings (a fresh lane there)."""
    import pickle

    copy = pickle.loads(pickle.dumps(BackgroundLane(2, name="figures")))
    assert (copy.max_in_flight, copy.name, copy.collect, copy.in_flight) == (2, "figures", False, 0)
    assert pickle.loads(pickle.dumps(BackgroundLane(1, nice=7))).nice == 7
    copy.submit(lambda: (tmp_path / "ran").touch())
    assert copy.close(timeout=5) and (tmp_path / "ran").exists()
    busy, gate = BackgroundLane(1, collect=True), threading.Event()
    busy.submit(gate.wait, label="slow")
    with pytest.raises(RuntimeError, match="in flight"):
        pickle.dumps(busy)
    gate.set()
    busy.result()
    busy.close(timeout=5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the nice value is per thread on Linux only")
def test_a_niced_lane_runs_its_jobs_and_their_pools_below_the_callers_priority():
    """Training keeps its priority; the summary and the pool threads it starts run ``nice`` lower (capped at 19), so on
    a CPU they take the cores training leaves idle first instead of stalling torch's intra-op threads."""
    from concurrent.futures import ThreadPoolExecutor

    def priority() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def job() -> tuple[int, list[int]]:
        with ThreadPoolExecutor(max_workers=2) as pool:
            return priority(), list(pool.map(lambda _: priority(), range(2)))

    caller = priority()
    lane = BackgroundLane(1, collect=True, nice=BACKGROUND_NICE)
    lane.submit(job)
    done = lane.result(timeout=30)
    assert done is not None
    own, pool = done[1]
    want = min(19, caller + BACKGROUND_NICE)
    assert own == want and pool == [want, want], (caller, own, pool)
    assert priority() == caller, "the caller (training) keeps its priority"
    plain = BackgroundLane(1, collect=True)
    plain.submit(priority)
    assert plain.result(timeout=30)[1] == caller
    assert lane.close(timeout=5) and plain.close(timeout=5)
    assert BACKGROUND_NICE > 0 and geometry_module.SpectralGeometryCallback()._summaries.nice == BACKGROUND_NICE


def test_a_collecting_lane_runs_one_summary_at_a_time_and_hands_back_its_result_or_error():
    lane = BackgroundLane(1, collect=True)
    gate = threading.Event()
    pending = lane.submit(lambda: (gate.wait(5), "results")[1], epoch=3, step=30)
    assert lane.pending is pending and not lane.done
    with pytest.raises(RuntimeError, match="epoch 3 is still pending"):
        lane.submit(lambda: None, epoch=4, step=40)
    with pytest.raises(TimeoutError, match="epoch 3 is still running"):
        lane.result(timeout=0.01)
    assert lane.pending is pending, "a timeout keeps it pending"
    gate.set()
    got, value = lane.result()
    assert (got.epoch, got.step, value) == (3, 30, "results") and got.seconds is not None
    assert lane.pending is None and lane.result() is None

    def boom() -> None:
        raise ValueError("eigensolver failed")

    lane.submit(boom, epoch=5, step=50)
    with pytest.raises(ValueError, match="eigensolver failed"):
        lane.result()
    assert lane.pending is None and not lane.failures, "a failed summary is handed back, no longer pending"
    lane.close()


# ----------------------------------------------------------------------------------------------------- in a fit
CLASSES, IMG = 4, 16


def _images(n: int, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, IMG, IMG, generator=generator), torch.arange(n) % CLASSES)


class _Classifier(L.LightningModule):
    def __init__(self, fail_at_epoch: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = timm.create_model(
            "vit_tiny_patch16_224", img_size=IMG, patch_size=4, depth=2, embed_dim=16, num_heads=2,
            num_classes=CLASSES,
        )  # fmt: skip
        self.fail_at_epoch = fail_at_epoch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.current_epoch == self.fail_at_epoch:
            raise RuntimeError("training failed")
        x, y = batch
        return F.cross_entropy(self.backbone(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SummaryLog:
    """What the summaries of a fit did: ``epochs`` summarised, in order, and what let each background summary finish.

    A background summary (one the summary lane runs) does not finish until the training thread has done something
    after handing it over: either it started the next training batch (``"training"``: training went on while the
    summary was in flight) or it began waiting for that summary (``"waited"``). ``released`` maps each epoch to the
    first of the two. The order of events on the training thread decides it, not a race of sleeps, so the
    assertions hold on a loaded machine; a summary then sleeps `SUMMARY_DELAY_S`, a floor for every wait for it.
    """

    def __init__(self) -> None:
        self.epochs: list[int] = []
        self.released: dict[int, str] = {}
        self._events: list[str] = []  # on the training thread, in order
        self._stamps: dict[int, int] = {}  # epoch -> len(_events) when it was handed over
        self._changed = threading.Condition()

    def event(self, what: str) -> None:
        with self._changed:
            self._events.append(what)
            self._changed.notify_all()

    def handed_over(self, epoch: int) -> None:
        with self._changed:
            self._stamps[epoch] = len(self._events)

    def wait_for_release(self, epoch: int) -> None:
        with self._changed:
            stamp = self._stamps.pop(epoch, None)
            if stamp is None:  # summary.background=false: the training thread runs it itself
                return
            if not self._changed.wait_for(lambda: len(self._events) > stamp, timeout=120):
                raise AssertionError(f"epoch {epoch}: nothing happened on the training thread for 120 s")
            self.released[epoch] = self._events[stamp]

    def clear(self) -> None:
        self.epochs.clear()
        self.released.clear()


@pytest.fixture
def slow_summary(monkeypatch) -> SummaryLog:
    """Every background summary waits for the training thread's next event, then sleeps `SUMMARY_DELAY_S`
    (`SummaryLog`); inline summaries only sleep."""
    log = SummaryLog()
    real_summary = geometry_module.summarize_and_record
    real_submit, real_result = BackgroundLane.submit, BackgroundLane.result

    def slow(reduced, **kwargs):
        log.wait_for_release(reduced.record.epoch)
        time.sleep(SUMMARY_DELAY_S)
        results = real_summary(reduced, **kwargs)
        log.epochs.append(reduced.record.epoch)
        return results

    def submit(worker, job, **kwargs):
        if worker.collect:  # the summary lane (the figure lane is patched too)
            log.handed_over(kwargs["epoch"])
        return real_submit(worker, job, **kwargs)

    def result(worker, timeout=None):
        if worker.pending is not None:
            log.event("waited")
        return real_result(worker, timeout)

    monkeypatch.setattr(geometry_module, "summarize_and_record", slow)
    monkeypatch.setattr(BackgroundLane, "submit", submit)
    monkeypatch.setattr(BackgroundLane, "result", result)
    monkeypatch.setattr(_Classifier, "on_train_batch_start", lambda module, batch, idx: log.event("training"))
    return log


def _fit(
    root: Path,
    *,
    epochs: int = 2,
    module: L.LightningModule | None = None,
    checkpoints: bool = False,
    ckpt_path: str | None = None,
    **settings: Any,
) -> tuple[SpectralGeometryCallback, L.Trainer]:
    analysis = stratified_subset(_images(16), per_class=4)
    callback = SpectralGeometryCallback(analysis=analysis, dirpath=root, **{**FAST, **settings})
    extra = [ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, every_n_epochs=1)] if checkpoints else []
    trainer = L.Trainer(
        max_epochs=epochs,
        default_root_dir=root,
        callbacks=[callback, *extra],
        accelerator="cpu",
        logger=L.pytorch.loggers.CSVLogger(root, name="logs"),
        enable_checkpointing=checkpoints,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=1,
        limit_val_batches=0,
    )
    trainer.fit(module or _Classifier(), DataLoader(_images(8, seed=1), batch_size=4), ckpt_path=ckpt_path)
    return callback, trainer


def _records(root: Path) -> tuple[list[tuple[str, ...]], dict[int, dict[str, dict[str, np.ndarray]]]]:
    rows = [tuple(row.values()) for row in read_metric_rows(root)]
    return rows, load_spectra(root)


def _logged(root: Path, tag: str) -> dict[int, float]:
    """``{epoch: value}`` of a scalar the CSV logger wrote (its row names the epoch in ``geometry/epoch``)."""
    import csv

    with open(root / "logs" / "version_0" / "metrics.csv", encoding="utf-8", newline="") as fh:
        return {int(row["geometry/epoch"]): float(row[tag]) for row in csv.DictReader(fh) if row.get(tag)}


def test_training_waits_only_for_the_pass_and_every_record_is_written_before_fit_returns(tmp_path, slow_summary):
    """The summaries of epochs 0 and 1 are still in flight when the next epoch's training starts: training waits for
    the pass and the logging of the scalars only. The last summary, in flight at the end, is collected (waited for,
    and the wait counted in its blocking seconds) before ``fit`` returns."""
    callback, _ = _fit(tmp_path / "background")
    assert slow_summary.epochs == [0, 1, 2] and recorded_epochs(tmp_path / "background") == [0, 1, 2]
    assert slow_summary.released == {0: "training", 1: "training", 2: "waited"}
    assert callback._summaries.pending is None and callback.last_summary_seconds >= SUMMARY_DELAY_S
    blocking = _logged(tmp_path / "background", "geometry/blocking_seconds")
    summary = _logged(tmp_path / "background", "geometry/summary_seconds")
    assert sorted(blocking) == sorted(summary) == [0, 1, 2]
    assert blocking[2] >= SUMMARY_DELAY_S, "the end of fit waited for the last summary, and says so"
    logged = (tmp_path / "background" / "logs" / "version_0" / "metrics.csv").read_text(encoding="utf-8")
    assert "geometry/effective_rank/block_02" in logged
    inline, _ = _fit(tmp_path / "inline", summary={"background": False})
    assert inline.last_blocking_seconds >= SUMMARY_DELAY_S
    rows, spectra = _records(tmp_path / "background")
    rows_inline, spectra_inline = _records(tmp_path / "inline")
    assert rows == rows_inline
    for epoch, points in spectra_inline.items():
        for name, arrays in points.items():
            for key, array in arrays.items():
                assert np.asarray(spectra[epoch][name][key]).tobytes() == np.asarray(array).tobytes(), (epoch, key)


def test_the_summary_in_flight_is_recorded_before_a_training_failure_is_raised(tmp_path, slow_summary):
    with pytest.raises(RuntimeError, match="training failed"):
        _fit(tmp_path, epochs=3, module=_Classifier(fail_at_epoch=1))
    assert slow_summary.epochs == [0, 1] and recorded_epochs(tmp_path) == [0, 1]


def test_checkpoints_wait_for_later_weights_and_list_the_pending_epoch_and_a_resume_observes_it_again(
    tmp_path, slow_summary
):
    _fit(tmp_path / "run", epochs=3, checkpoints=True, every_n_epochs=2)
    ckpts = {int(p.stem.split("=")[1].split("-")[0]): p for p in (tmp_path / "run" / "ckpt").glob("*.ckpt")}
    assert sorted(ckpts) == [0, 1, 2]  # saved after training epochs 1, 2, 3 (0-based names)
    states = {e: load_weights_only(p)["callbacks"] for e, p in ckpts.items()}
    geometry = {e: next(v for k, v in s.items() if "SpectralGeometryCallback" in k) for e, s in states.items()}
    assert {state.pop("records_dir") for state in geometry.values()} == {str((tmp_path / "run").absolute())}
    # after epoch 1: epoch 0's summary (step 0) was older than the weights (step 1): the checkpoint waited for it
    assert geometry[0] == {"observed_epochs": [0], "pending_epochs": [], **NO_STEPS}
    # after epoch 2: the observation of these very weights was in flight
    assert geometry[1] == {"observed_epochs": [0], "pending_epochs": [2], **NO_STEPS}
    assert observed_in_checkpoint(ckpts[1]) == [0, 2], "the pending epoch's records belong to this checkpoint"
    # after epoch 3, the last: a resume from it would find max_epochs reached and observe nothing, so it waited
    assert geometry[2] == {"observed_epochs": [0, 2, 3], "pending_epochs": [], **NO_STEPS}
    original = load_spectra(tmp_path / "run")[2]
    # The run died before epoch 2's records were written: they are missing when it resumes from that checkpoint.
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "run", resumed)
    set_aside_epochs(RunDir(resumed), [2, 3], "simulated: killed before the summary of epoch 2 was written")
    assert recorded_epochs(resumed) == [0]
    slow_summary.clear()
    _fit(resumed, epochs=3, every_n_epochs=2, ckpt_path=str(resumed / "ckpt" / ckpts[1].name))
    assert slow_summary.epochs == [2, 3] and recorded_epochs(resumed) == [0, 2, 3]
    again = load_spectra(resumed)[2]
    for name, arrays in original.items():
        for key, array in arrays.items():
            assert np.asarray(again[name][key]).tobytes() == np.asarray(array).tobytes(), (name, key)


def test_a_resume_whose_pending_epoch_was_recorded_lists_it_as_observed_in_its_own_checkpoints(tmp_path, slow_summary):
    """The run died after the pending epoch's records were written: the resumed run keeps them, and its checkpoints
    list that epoch as observed (a later resume must not set its records aside as newer than the checkpoint)."""
    _fit(tmp_path, epochs=3, checkpoints=True, every_n_epochs=2)
    pending_ckpt = next((tmp_path / "ckpt").glob("epoch=1-*.ckpt"))  # saved with pending_epochs [2]
    set_aside_epochs(RunDir(tmp_path), [3], "simulated: killed after epoch 2's records, before epoch 3")
    pending_ckpt = shutil.copy(pending_ckpt, tmp_path / "resume_from.ckpt")
    shutil.rmtree(tmp_path / "ckpt")
    slow_summary.clear()
    _fit(tmp_path, epochs=4, checkpoints=True, every_n_epochs=2, ckpt_path=str(pending_ckpt))
    assert slow_summary.epochs == [4] and recorded_epochs(tmp_path) == [0, 2, 4]
    for path in (tmp_path / "ckpt").glob("*.ckpt"):
        assert 2 in observed_in_checkpoint(path), path.name


# ----------------------------------------------------------------------------------------------------- figures in a fit
def test_every_figure_is_written_before_fit_returns(tmp_path, slow_rendering):
    run(compose_train(tmp_path, [*QUICK, "trainer.max_epochs=2"]))
    ev = events(tmp_path)
    for tag in FIGURES:
        assert [e.step for e in ev.Images(tag)] == [0, 1, 2], tag
    assert [e.step for e in ev.Scalars("geometry/blocking_seconds")] == [0, 1, 2]
    assert threading.active_count() == 1 or not any(t.name == "tgo-geometry-figures" for t in threading.enumerate())


def test_figures_of_completed_observations_are_flushed_when_training_raises(tmp_path, slow_rendering):
    crash = ["+callbacks.crash._target_=tests.helpers.CrashAtEpochStart", "+callbacks.crash.epoch=2"]
    with pytest.raises(SimulatedCrash):
        run(compose_train(tmp_path, [*QUICK, "trainer.max_epochs=4", *crash]))
    assert sorted({int(r["epoch"]) for r in read_metric_rows(tmp_path)}) == [0, 1, 2], "records intact"
    ev = events(tmp_path)
    for tag in FIGURES:
        assert [e.step for e in ev.Images(tag)] == [0, 1, 2], tag
    assert not any(t.name == "tgo-geometry-figures" for t in threading.enumerate())
