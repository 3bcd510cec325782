"""Resuming after a kill: the records agree with the checkpoint, and no directory needs a human to go on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import NO_FIGURES, compose_train
from tests.helpers import SimulatedCrash
from tgo.observe import observe_models
from tgo.records import RunDir, load_spectra, read_metric_rows, recorded_epochs
from tgo.resume import (
    SET_ASIDE,
    ChangedAnalysisSubsetError,
    NewerRecords,
    ResumeError,
    StartPlan,
    check_same_analysis_subset,
    check_same_run,
    newest_checkpoint,
    plan_start,
    record_run_id,
    recorded_run_id,
    records_after,
    run_id_path,
    set_aside_epochs,
    set_aside_newer_checkpoints,
)
from tgo.safe_load import load_weights_only
from tgo.train import run

FAST = [
    "experiment=smoke",
    *NO_FIGURES,  # records and checkpoints are what a resume must get right (tests/callbacks/ cover the figures)
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
]


def crash(where: str, epoch: int) -> list[str]:
    return [f"+callbacks.crash._target_=tests.helpers.{where}", f"+callbacks.crash.epoch={epoch}"]


def epoch_counts(run_dir: Path) -> dict[int, int]:
    """How many times each epoch's rows were recorded for one (point, view, metric)."""
    rows = [
        r for r in read_metric_rows(run_dir) if (r["point"], r["view"], r["metric"]) == ("cls", "all", "effective_rank")
    ]
    counts: dict[int, int] = {}
    for r in rows:
        counts[int(r["epoch"])] = counts.get(int(r["epoch"]), 0) + 1
    return counts


@pytest.mark.slow
def test_records_newer_than_the_checkpoint_are_set_aside_and_observed_again(tmp_path):
    """A kill between the last epoch's records and its checkpoint: the resumed run retrains it and re-observes it."""
    run_dir = tmp_path / "run"
    with pytest.raises(SimulatedCrash):
        run(compose_train(run_dir, [*FAST, "trainer.max_epochs=2", *crash("CrashAtEpochEnd", 1)]))
    assert recorded_epochs(run_dir) == [0, 1, 2]  # epoch 2 recorded, but last.ckpt still holds epoch 1's weights
    stale = [r for r in read_metric_rows(run_dir) if r["epoch"] == "2"]
    run(compose_train(run_dir, [*FAST, "trainer.max_epochs=2", "ckpt_path=last"]))
    assert epoch_counts(run_dir) == {0: 1, 1: 1, 2: 1}
    # The run's last record is what its last checkpoint holds.
    (source,) = observe_models(checkpoint=str(RunDir(run_dir).last_checkpoint), out=tmp_path / "again")
    assert source.epoch == 2
    trained, again = load_spectra(run_dir, epochs=[2])[2], load_spectra(tmp_path / "again")[2]
    for point, arrays in trained.items():
        top = arrays["eigenvalues"][0]
        np.testing.assert_allclose(again[point]["eigenvalues"], arrays["eigenvalues"], rtol=1e-10, atol=1e-10 * top)

    (aside,) = (run_dir / SET_ASIDE).iterdir()
    assert "recorded after last.ckpt was saved" in (aside / "REASON.txt").read_text(encoding="utf-8")
    assert (aside / "geometry" / "spectra" / "epoch_0002.npz").is_file()
    assert read_metric_rows(aside) == stale  # moved, not lost


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_starts_over_with_ckpt_path_last(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(SimulatedCrash):
        run(compose_train(run_dir, [*FAST, "trainer.max_epochs=1", *crash("CrashAtEpochEnd", 0)]))
    assert recorded_epochs(run_dir) == [0, 1] and not RunDir(run_dir).last_checkpoint.exists()
    run(compose_train(run_dir, [*FAST, "trainer.max_epochs=1", "ckpt_path=last"]))
    assert epoch_counts(run_dir) == {0: 1, 1: 1}
    (aside,) = (run_dir / SET_ASIDE).iterdir()
    assert {p.name for p in aside.iterdir()} >= {"REASON.txt", "geometry", "tensorboard"}
    assert recorded_epochs(aside) == [0, 1]


def _started_run(root: Path) -> RunDir:
    run_dir = RunDir(root)
    root.mkdir()
    run_dir.config.write_text("seed: 0\n", encoding="utf-8")
    return run_dir


def test_plan_start_resumes_a_requeued_job_from_its_newest_checkpoint(tmp_path):
    run_dir = _started_run(tmp_path / "run")
    nothing_saved = plan_start(None, run_dir, requeued=True)
    assert nothing_saved.checkpoint is None and "before its first checkpoint" in str(nothing_saved.start_over)
    run_dir.checkpoints.mkdir()
    run_dir.last_checkpoint.write_bytes(b"x")
    assert plan_start(None, run_dir, requeued=True) == StartPlan(str(run_dir.last_checkpoint))
    hpc = run_dir.root / "hpc_ckpt_1.ckpt"
    hpc.write_bytes(b"x")
    assert newest_checkpoint(run_dir) == hpc  # written after last.ckpt: the preemption signal's checkpoint
    assert plan_start(None, run_dir, requeued=False) == StartPlan(None)  # a fresh launch is the caller's to refuse
    assert plan_start("last", run_dir, requeued=False) == StartPlan("last")


def test_ckpt_path_last_where_nothing_was_saved_yet_starts_from_scratch(tmp_path):
    """A kill during start-up leaves only Hydra's files (or nothing): the relaunch still goes on, from scratch."""
    plan = plan_start("last", RunDir(tmp_path / "never_written"), requeued=False)
    assert plan.checkpoint is None and "holds no checkpoint (nothing was saved yet)" in str(plan.start_over)


def test_set_aside_epochs_moves_rows_and_spectra_and_keeps_the_rest(smoke_run, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(smoke_run, run_dir)
    before = read_metric_rows(run_dir)
    target = set_aside_epochs(RunDir(run_dir), [2], "test")
    assert target is not None and recorded_epochs(run_dir) == [0, 1]
    assert read_metric_rows(run_dir) == [r for r in before if r["epoch"] != "2"]
    assert read_metric_rows(target) == [r for r in before if r["epoch"] == "2"]
    assert (target / "geometry" / "spectra" / "epoch_0002.npz").is_file()
    assert set_aside_epochs(RunDir(run_dir), [7], "nothing there") is None


def _manifest(run_dir: RunDir, **changes: object) -> dict:
    manifest = json.loads(run_dir.manifest.read_text(encoding="utf-8"))
    return {**manifest, **changes}


def test_a_resume_with_the_same_subset_passes_and_any_change_is_named(smoke_run):
    run_dir = RunDir(smoke_run)
    same = _manifest(run_dir)
    check_same_analysis_subset(run_dir, same)
    items = same["items"]
    fewer = _manifest(run_dir, items=items[:30])
    with pytest.raises(ChangedAnalysisSubsetError, match=r"50 images then, 30 now \(20 left out, 0 new"):
        check_same_analysis_subset(run_dir, fewer)
    edited = _manifest(run_dir, items=[{**items[0], "sha256": "0" * 64}, *items[1:]])
    with pytest.raises(ChangedAnalysisSubsetError, match=rf"1 image\(s\) changed on disk, e.g. {items[0]['key']!r}"):
        check_same_analysis_subset(run_dir, edited)
    resized = _manifest(run_dir, source_info={**same["source_info"], "image_size": 24})
    with pytest.raises(ChangedAnalysisSubsetError, match=r"image size 16 then, 24 now"):
        check_same_analysis_subset(run_dir, resized)


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 1, "source": "caf\xe9"}'], ids=["not-json", "latin-1"])
def test_a_runs_manifest_that_cannot_be_read_stops_the_resume_in_one_line(tmp_path: Path, content: bytes):
    run_dir = RunDir(tmp_path)
    run_dir.manifest.parent.mkdir(parents=True, exist_ok=True)
    run_dir.manifest.write_bytes(content)
    with pytest.raises(
        ChangedAnalysisSubsetError, match=r"analysis_subset\.json: unreadable \(.*\); expected the run's"
    ):
        check_same_analysis_subset(run_dir, {"version": 1})


@pytest.mark.slow
def test_resuming_with_a_changed_analysis_subset_stops_before_anything_is_written(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(SimulatedCrash):
        run(compose_train(run_dir, [*FAST, "trainer.max_epochs=2", *crash("CrashAtEpochStart", 1)]))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    cfg = compose_train(run_dir, [*FAST, "trainer.max_epochs=2", "ckpt_path=last", "data.analysis.per_class=3"])
    with pytest.raises(ChangedAnalysisSubsetError, match=r"50 images then, 30 now"):
        run(cfg)
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_an_interrupted_run_equals_the_uninterrupted_run_bit_for_bit(tmp_path):
    """Killed between epoch 2's records and its checkpoint, then resumed: every recorded number, including the
    re-observed epoch 2, equals the uninterrupted run's exactly (the random states travel in the checkpoint, and the
    observation draws from its own stream)."""
    settings = [*FAST, "trainer.max_epochs=3", "trainer.limit_train_batches=3"]
    run(compose_train(tmp_path / "whole", settings))
    with pytest.raises(SimulatedCrash):
        run(compose_train(tmp_path / "interrupted", [*settings, *crash("CrashAtEpochEnd", 1)]))
    run(compose_train(tmp_path / "interrupted", [*settings, "ckpt_path=last"]))
    whole, interrupted = read_metric_rows(tmp_path / "whole"), read_metric_rows(tmp_path / "interrupted")
    assert [r["epoch"] for r in whole] == [r["epoch"] for r in interrupted]
    assert interrupted == whole  # every value and standard error, as written (NaN included)
    spectra_whole, spectra_interrupted = load_spectra(tmp_path / "whole"), load_spectra(tmp_path / "interrupted")
    for epoch, points in spectra_whole.items():
        for point, arrays in points.items():
            for name, array in arrays.items():
                assert np.array_equal(spectra_interrupted[epoch][point][name], array), (epoch, point, name)


def test_checkpoints_newer_than_the_restored_one_are_set_aside_and_older_ones_kept(smoke_run, tmp_path):
    run_dir = RunDir(tmp_path / "copy")
    shutil.copytree(smoke_run, run_dir.root)
    torch.save({"global_step": 10**6}, run_dir.checkpoints / "best_epoch_009.ckpt")  # saved after last.ckpt
    torch.save({"global_step": 0}, run_dir.checkpoints / "best_epoch_000_old.ckpt")
    assert [p.name for p in set_aside_newer_checkpoints(run_dir, run_dir.last_checkpoint)] == ["best_epoch_009.ckpt"]
    assert (run_dir.checkpoints / "best_epoch_000_old.ckpt").is_file() and run_dir.last_checkpoint.is_file()
    (aside,) = (run_dir.root / SET_ASIDE).iterdir()
    assert (aside / "checkpoints" / "best_epoch_009.ckpt").is_file()


def test_a_resume_removes_the_temporary_files_a_killed_writer_left(smoke_run, tmp_path):
    run_dir = RunDir(tmp_path / "copy")
    shutil.copytree(smoke_run, run_dir.root)
    left = [run_dir.geometry / ".metrics.csv.x1.tmp", run_dir.spectra_dir / ".epoch_0003.npz.x2.tmp"]
    left.append(run_dir.checkpoints / ".last.ckpt.x3.tmp")
    for path in left:
        path.write_bytes(b"partial")
    StartPlan("last").prepare(run_dir, str(run_dir.last_checkpoint))
    assert not any(p.exists() for p in left)
    assert recorded_epochs(run_dir.root) == [0, 1, 2] and run_dir.last_checkpoint.is_file()


def test_a_report_over_a_directory_of_runs_never_takes_a_set_aside_attempt_for_a_run(smoke_run, tmp_path):
    from tgo.report.runs import discover_runs

    run_dir = RunDir(tmp_path / "runs" / "one")
    shutil.copytree(smoke_run, run_dir.root)
    set_aside_epochs(run_dir, [2], "test")  # set_aside/<time>/geometry/ holds records too
    assert discover_runs([tmp_path / "runs"]) == [run_dir.root]


# ------------------------------------------------------------------------------------------- refused resumes
@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run killed between epoch 2's records and its checkpoint: records of epochs 0-2, ``last.ckpt`` of epoch 1,
    so a resume from it would set epoch 2 aside (copy it to change it)."""
    run_dir = tmp_path_factory.mktemp("crashed") / "run"
    with pytest.raises(SimulatedCrash):
        run(compose_train(run_dir, [*FAST, "trainer.max_epochs=2", *crash("CrashAtEpochEnd", 1)]))
    assert recorded_epochs(run_dir) == [0, 1, 2]
    return run_dir


def _copy(crashed: Path, tmp_path: Path) -> RunDir:
    run_dir = RunDir(tmp_path / "run")
    shutil.copytree(crashed, run_dir.root)
    return run_dir


def _kept_files(run_dir: RunDir) -> dict[str, bytes]:
    """Every file of the run a refused resume must leave as it was (the logger's events and a lock aside)."""
    files = [p for p in run_dir.root.rglob("*") if p.is_file() and RunDir.TENSORBOARD not in p.parts]
    return {str(p.relative_to(run_dir.root)): p.read_bytes() for p in files if not p.name.startswith(".tgo-lock")}


def _refused(run_dir: RunDir, overrides: list[str]) -> str:
    """The one line `tgo.train` prints for a resume it refuses, after checking that nothing changed."""
    from tgo.train import error_line

    kept = _kept_files(run_dir)
    with pytest.raises(ResumeError) as refused:
        run(compose_train(run_dir.root, [*FAST, *overrides]))
    assert _kept_files(run_dir) == kept and not (run_dir.root / SET_ASIDE).exists(), "nothing moved or written"
    line = error_line(refused.value)
    assert line is not None and "\n" not in line, line
    return line


@pytest.mark.slow
def test_a_checkpoint_of_another_architecture_is_refused_in_one_line_and_the_right_one_then_resumes(crashed, tmp_path):
    """Issue 33, finding 6: it moved epochs 1-2 aside, failed in a 138-line traceback, and the run then ended with
    epochs [0, 2, 3]. The checkpoint of a 3-block model (the run's has 4) is refused before anything is moved."""
    run_dir = _copy(crashed, tmp_path)
    right = run_dir.last_checkpoint.read_bytes()
    state = load_weights_only(run_dir.last_checkpoint)
    state["state_dict"] = {k: v for k, v in state["state_dict"].items() if not k.startswith("net.blocks.3.")}
    torch.save(state, tmp_path / "three_blocks.ckpt")  # not over the file its tensors are memory-mapped from
    (tmp_path / "three_blocks.ckpt").replace(run_dir.last_checkpoint)
    line = _refused(run_dir, ["trainer.max_epochs=2", "ckpt_path=last"])
    assert "does not fit this run's model (missing keys: net.blocks.3." in line and "nothing was moved" in line
    run_dir.last_checkpoint.write_bytes(right)
    run(compose_train(run_dir.root, [*FAST, "trainer.max_epochs=2", "ckpt_path=last"]))
    assert epoch_counts(run_dir.root) == {0: 1, 1: 1, 2: 1}


@pytest.mark.slow
def test_another_runs_checkpoint_is_refused_before_anything_is_moved(crashed, smoke_run, tmp_path):
    """Issue 33, finding 6: ``ckpt_path=<another run's checkpoint>`` appended an epoch trained from the other run's
    weights without a word. Same model, same data: only the run id (checkpoint against ``geometry/run.json``) tells."""
    run_dir = _copy(crashed, tmp_path)
    other = RunDir(smoke_run).last_checkpoint
    line = _refused(run_dir, ["trainer.max_epochs=3", f"ckpt_path={other}"])
    assert f"ckpt_path: '{other}' holds the weights of another training" in line and str(run_dir.root) in line


@pytest.mark.slow
def test_a_duplicated_record_a_resume_would_keep_is_refused_naming_the_file(crashed, tmp_path):
    """Issue 33, finding 6: a duplicated epoch of ``metrics.csv`` was carried through a resume (the report then
    refused the run). Epoch 1 is the checkpoint's: which copy is its own cannot be told, so the resume stops."""
    run_dir = _copy(crashed, tmp_path)
    lines = run_dir.metrics.read_text(encoding="utf-8").splitlines(keepends=True)
    run_dir.metrics.write_text(
        "".join([*lines, *(line for line in lines[1:] if line.startswith("1,"))]), encoding="utf-8"
    )
    line = _refused(run_dir, ["trainer.max_epochs=2", "ckpt_path=last"])
    assert f"{run_dir.metrics}: line {len(lines) + 1} repeats epoch 1, point " in line and "of line " in line


@pytest.mark.slow
def test_a_duplicated_record_after_the_checkpoint_leaves_with_the_records_set_aside(crashed, tmp_path):
    """A duplicate among the records a resume sets aside (epoch 2, after ``last.ckpt``) goes with them, both copies,
    and the resumed run records that epoch once."""
    run_dir = _copy(crashed, tmp_path)
    lines = run_dir.metrics.read_text(encoding="utf-8").splitlines(keepends=True)
    twice = [line for line in lines[1:] if line.startswith("2,")]
    run_dir.metrics.write_text("".join([*lines, *twice]), encoding="utf-8")
    run(compose_train(run_dir.root, [*FAST, "trainer.max_epochs=2", "ckpt_path=last"]))
    assert epoch_counts(run_dir.root) == {0: 1, 1: 1, 2: 1}
    (aside,) = (run_dir.root / SET_ASIDE).iterdir()
    assert len(read_metric_rows(aside)) == 2 * len(twice)


def test_records_after_a_checkpoint_are_those_it_does_not_list_or_later_epochs_without_its_state(smoke_run):
    """A checkpoint with the geometry callback's state decides by its list (the pending epoch counts as observed);
    one without it (saved by a fit without TGO) by its own epoch: every record of a later epoch is newer."""
    run_dir = RunDir(smoke_run)
    assert recorded_epochs(run_dir) == [0, 1, 2]
    assert records_after(run_dir, [0, 2], epoch=2, step=0) == NewerRecords([1], [])
    assert records_after(run_dir, None, epoch=1, step=0) == NewerRecords([2], [])
    assert records_after(run_dir, None, epoch=2, step=0) == NewerRecords([], [])


def test_run_ids_that_cannot_be_compared_pass_and_differing_ones_are_refused(tmp_path):
    """Runs and checkpoints from before run ids (either id missing) are accepted: nothing tells them apart."""
    run_dir = RunDir(tmp_path / "run")
    check_same_run(run_dir, "any.ckpt", "a" * 32)  # no geometry/run.json: a run recorded before run ids
    record_run_id(run_dir, "b" * 32)
    assert recorded_run_id(run_dir) == "b" * 32
    check_same_run(run_dir, "old.ckpt", None)  # a checkpoint saved before run ids, or without the callback
    check_same_run(run_dir, "own.ckpt", "b" * 32)
    another = r"'other.ckpt' holds the weights of another training \(run id aaaaaaaaaaaa\)"
    with pytest.raises(ResumeError, match=another):
        check_same_run(run_dir, "other.ckpt", "a" * 32)
    run_id_path(run_dir).write_text("not json", encoding="utf-8")
    with pytest.raises(ResumeError, match=r"run.json: unreadable"):
        recorded_run_id(run_dir)
