"""The background figure worker: bounded, never loses a job, and is drained before ``fit`` returns or re-raises."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import compose_train
from tests.helpers import SimulatedCrash
from tgo import viz
from tgo.callbacks.figure_worker import FigureWorker
from tgo.records import read_metric_rows
from tgo.train import run

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


def test_worker_runs_jobs_in_order_and_bounds_the_jobs_in_flight():
    worker = FigureWorker(max_in_flight=2)
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
    with pytest.raises(RuntimeError, match="after close"):
        worker.submit(job(3))


def test_held_worker_pauses_between_steps_and_a_full_submit_does_not_deadlock():
    worker = FigureWorker(max_in_flight=1)
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
        assert worker.submit(job) > 0.1, "waited for room, the worker ran meanwhile"
        time.sleep(0.2)
        assert steps == [1, 2], "held again once the job is queued"
    assert worker.close(timeout=5) and steps == [1, 2, 1, 2]


def test_a_failing_job_warns_and_the_next_one_still_runs():
    worker = FigureWorker()
    done: list[str] = []

    def boom() -> None:
        raise ValueError("bad figure")

    with pytest.warns(RuntimeWarning, match="bad figure"):
        worker.submit(boom, label="boom")
        worker.submit(lambda: done.append("ok"))
        assert worker.close(timeout=5)
    assert done == ["ok"] and [label for label, _ in worker.failures] == ["boom"]


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
