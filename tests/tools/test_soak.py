"""The fault-injection soak (``make soak``, ``tools/soak.py``): its verdicts can fail, and a short soak passes.

The soak is only worth its minutes if its checker would notice a broken run, so the checker is fed hand-made run
directories with a lost, a duplicated and an unscheduled epoch, a damaged file, a leftover ``.tmp`` and a last record
that differs from its checkpoint. The ``summary`` kill's trigger (the ``summary in the background`` line in a launch's
log) is fed a hand-written log and a stand-in launch that prints the line. The end-to-end test runs one real trial
(a ``kill -9`` right after epoch 0's records, before any checkpoint, so the relaunch must set the attempt aside and
start over), each launch in a fresh interpreter.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import NO_FIGURES
from tgo.records import METRICS_COLUMNS, RunDir
from tools import soak


def _write_run(root: Path, epochs: list[int], spectra: list[int]) -> RunDir:
    """A run directory with one metrics row per entry of ``epochs`` and a spectra file per entry of ``spectra``."""
    run = RunDir(root)
    run.spectra_dir.mkdir(parents=True)
    lines = [",".join(METRICS_COLUMNS)] + [f"{e},{e * 2},cls,all,effective_rank,{1.5 + e},nan" for e in epochs]
    run.metrics.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for e in spectra:
        arrays: dict[str, Any] = {"cls/eigenvalues": np.array([3.0, 2.0, 1.0 + e]), "cls/n_rows": np.int64(50)}
        np.savez(run.spectra(e), **arrays)
    return run


def test_a_clean_run_passes_the_records_check(tmp_path):
    run = _write_run(tmp_path / "run", [0, 1, 2], [0, 1, 2])
    found = soak.check_records(run.root, max_epochs=2)
    assert not found.failed and found.leftovers == []


def test_the_records_check_finds_lost_duplicated_unscheduled_corrupt_and_leftover_files(tmp_path):
    run = _write_run(tmp_path / "run", [0, 1, 1, 3, 4], [0, 1, 3])
    run.spectra(3).write_bytes(run.spectra(3).read_bytes()[:40])  # truncated: epoch 3 counts as lost and corrupt
    (run.geometry / ".metrics.csv.x1y2.tmp").write_text("half a write", encoding="utf-8")
    aside = run.root / "set_aside" / "2026-11-30T12-00-00Z" / "geometry" / "spectra"
    aside.mkdir(parents=True)
    (aside / "epoch_0002.npz").write_bytes(b"PK\x03\x04 not really a zip")
    found = soak.check_records(run.root, max_epochs=3)
    assert found.failed
    assert found.lost == [2, 3]
    assert found.duplicated == ["epoch 1 cls/all/effective_rank x2", "epoch 4 recorded but not scheduled"]
    assert [c.split(":")[0] for c in found.corrupt] == [
        "geometry/spectra/epoch_0003.npz",
        "set_aside/2026-11-30T12-00-00Z/geometry/spectra/epoch_0002.npz",
    ]
    assert found.leftovers == ["geometry/.metrics.csv.x1y2.tmp"]


def test_leftovers_count_extra_best_checkpoints_and_the_launches_tmpdir(tmp_path):
    run = _write_run(tmp_path / "run", [0], [0])
    run.checkpoints.mkdir()
    for name in ("best_epoch_001.ckpt", "best_epoch_002.ckpt"):
        (run.checkpoints / name).write_bytes(b"x")
    tmpdir = tmp_path / "tmp"
    (tmpdir / "staging").mkdir(parents=True)
    (tmpdir / "staging" / "last.ckpt").write_bytes(b"x")
    assert soak.leftover_files(run.root, tmpdir) == [
        "checkpoints/best_epoch_001.ckpt (one of 2 best checkpoints)",
        "$TMPDIR/staging/last.ckpt",
    ]


def test_the_last_record_check_flags_a_record_that_is_not_what_last_ckpt_holds(tmp_path):
    """The re-observation is faked (no torch): what it writes decides the verdict."""
    run = _write_run(tmp_path / "run", [0, 1], [0, 1])
    run.checkpoints.mkdir()
    run.last_checkpoint.write_bytes(b"weights")

    def reobserve_as(eigenvalues: list[float], epoch: int = 1) -> soak.Reobserve:
        def fake(checkpoint: Path, out: Path) -> int:
            assert checkpoint == run.last_checkpoint
            RunDir(out).spectra_dir.mkdir(parents=True, exist_ok=True)
            arrays: dict[str, Any] = {"cls/eigenvalues": np.array(eigenvalues)}
            np.savez(RunDir(out).spectra(epoch), **arrays)
            return epoch

        return fake

    same, worst = soak.check_last_record(run.root, 1, tmp_path / "a", reobserve_as([3.0, 2.0, 2.0 + 1e-15]))
    assert same == [] and worst is not None and worst < 1e-10
    moved, worst = soak.check_last_record(run.root, 1, tmp_path / "b", reobserve_as([3.0, 2.0, 2.001]))
    assert len(moved) == 1 and moved[0].startswith("cls/eigenvalues: differs") and worst == pytest.approx(0.001 / 3)
    older, _ = soak.check_last_record(run.root, 1, tmp_path / "c", reobserve_as([3.0, 2.0, 1.0], epoch=0))
    assert older == ["last.ckpt holds epoch 0, the schedule ends at 1"]


def test_file_events_count_from_the_launch_on(tmp_path):
    """What an earlier launch left is the baseline; a new file or a replacement (new inode) is one event each."""
    run = _write_run(tmp_path / "run", [0], [0])
    watcher = soak.EventWatcher(run.root, "spectra")
    assert watcher.poll() == 0
    np.savez(run.spectra(1), x=np.zeros(1))
    assert watcher.poll() == 1
    replacement = run.spectra_dir / "new.npz"
    np.savez(replacement, x=np.ones(1))
    os.replace(replacement, run.spectra(1))
    assert watcher.poll() == 2
    tmp_watcher = soak.EventWatcher(run.root, "geometry_tmp")
    (run.geometry / ".metrics.csv.a.tmp").write_text("", encoding="utf-8")
    assert tmp_watcher.poll() == 1 and tmp_watcher.poll() == 1
    fresh = soak.EventWatcher(tmp_path / "new_run", "run_dir")
    assert fresh.poll() == 0
    (tmp_path / "new_run" / ".hydra").mkdir(parents=True)
    assert fresh.poll() == 1
    assert soak.EventWatcher(tmp_path / "new_run", "run_dir").poll() == 0  # a relaunch finds it already there


def test_a_relaunch_that_fails_on_its_own_counts_as_needing_a_human(tmp_path, monkeypatch):
    """A non-zero exit that is not our kill ends the trial: not survived, one "needed a human" in the table."""
    outcomes = iter(
        [
            soak.Launch(0, -9, killed=True, seconds=1.0, planned="run_dir#1", landed="at 1.0s", left=".hydra"),
            soak.Launch(1, 2, killed=False, seconds=1.0, last_line="tgo.train: error: ckpt_path: ... does not exist"),
        ]
    )
    monkeypatch.setattr(soak, "launch", lambda *args, **kwargs: next(outcomes))
    trial = soak.run_trial(0, tmp_path, [soak.Kill("run_dir")], 1, [30.0])
    assert not trial.survived and not trial.ok and len(trial.launches) == 2
    assert trial.human == (
        "launch 1 exit 2: tgo.train: error: ckpt_path: ... does not exist (the run directory after the kill held: "
        ".hydra)"
    )
    assert "NEEDED A HUMAN" in trial.line() and trial.line().endswith("-> FAIL")
    _, row = soak.table([trial]).splitlines()
    assert dict(zip(soak.COLUMNS, row.split()[:7], strict=False))["needed a human"] == "1"


def test_plans_are_reproducible_from_the_seed():
    import random

    first = [soak.plan_trial(random.Random(7), 3) for _ in range(5)]
    again = [soak.plan_trial(random.Random(7), 3) for _ in range(5)]
    assert first == again and all(1 <= len(kills) <= 3 for kills in first)
    assert {k.kind for kills in first for k in kills} <= set(soak.KINDS)
    assert all(k.kind != "run_dir" for kills in first for k in kills[1:])  # only a first launch creates the run dir


def test_summary_kills_are_planned_and_kinds_can_be_forced():
    import random

    assert "summary" in soak.KINDS and "summary" not in soak.FILE_KINDS
    assert "observation.summary.background=true" in soak.FAST  # the soak kills the summary it says it kills
    assert "summary" in {k.kind for seed in range(20) for k in soak.plan_trial(random.Random(seed), 3)}
    rng = random.Random(0)
    only = [soak.plan_trial(rng, 3, ("summary",)) for _ in range(20)]
    assert {k.kind for kills in only for k in kills} == {"summary"}
    assert all(1 <= k.nth <= 4 for kills in only for k in kills)  # epochs 0 .. 3 each log one summary line
    assert all(1 <= k.nth <= 2 for kills in only for k in kills[1:])
    kill = soak.Kill("summary", nth=2, fraction=0.5)
    assert kill.delay_s == pytest.approx(soak.SUMMARY_DELAY_S / 2) and kill.describe(30.0) == "summary#2+0.15s"
    assert soak.Kill("spectra", nth=2, fraction=0.5).delay_s == 0.0
    assert [(k.kind, k.nth) for k in soak.plan_trial(random.Random(1), 3, ("run_dir",))] == [("run_dir", 1)]
    with pytest.raises(ValueError, match="summry"):
        soak.plan_trial(random.Random(1), 3, ("summry",))
    assert soak.parse_args(["--kinds", "summary, ckpt_replaced"]).kinds == ("summary", "ckpt_replaced")
    assert soak.parse_args([]).kinds == soak.KINDS
    with pytest.raises(SystemExit) as usage:
        soak.parse_args(["--kinds", "summary,nope"])
    assert usage.value.code == 2


SUMMARY_LINE = "[tgo] geometry of epoch {} streamed and reduced over 50 images in 0.84 s; summary in the background"


def test_the_summary_trigger_counts_the_lines_a_launch_appends_to_its_log(tmp_path):
    """The command line already in the log is no event; a line behind a progress bar counts; a line split across two
    writes counts once, when it is complete; the report says whether the epoch's records and a new last.ckpt are
    there."""
    run = _write_run(tmp_path / "run", [0], [0])
    log = tmp_path / "launch_1.log"
    log.write_text(f"python -m tgo.train ... # {SUMMARY_LINE.format(9)}\n", encoding="utf-8")
    watcher = soak.LogWatcher(log, run.root)
    assert watcher.poll() == 0 and watcher.landed() == "no summary line seen"

    def append(text: str) -> None:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(text)

    append("Sanity Checking DataLoader 0: 100%|##########| 1/1 [00:00<00:00]   " + SUMMARY_LINE.format(0) + "\n")
    assert watcher.poll() == 1 and watcher.epoch == 0
    assert watcher.landed() == "epoch 0's records already in metrics.csv, last.ckpt not replaced since its line"
    line = SUMMARY_LINE.format(1)
    append("Epoch 0: 100%|##########| 2/2 " + line[:30])
    assert watcher.poll() == 1
    append(line[30:] + "\n")
    assert watcher.poll() == 2 and watcher.epoch == 1 and watcher.poll() == 2
    run.checkpoints.mkdir()
    run.last_checkpoint.write_bytes(b"weights of epoch 1")
    assert watcher.landed() == "epoch 1's records not yet in metrics.csv, last.ckpt replaced since its line"
    append(SUMMARY_LINE.format(2).replace("in the background", "in 0.20 s") + "\n")  # an inline summary: no event
    assert watcher.poll() == 2


def test_a_summary_kill_lands_its_delay_after_the_line(tmp_path, monkeypatch):
    """A stand-in launch prints the line and sleeps: it is killed (the whole process group) about the kill's delay
    after the line, and the launch says where it landed."""
    script = f"import time; print({SUMMARY_LINE.format(2)!r}, flush=True); time.sleep(60)"
    monkeypatch.setattr(soak, "train_command", lambda *args, **kwargs: [sys.executable, "-c", script])
    kill = soak.Kill("summary", nth=1, fraction=0.5)
    result = soak.launch(tmp_path, 0, 3, kill, 30.0, timeout_s=30.0)
    assert result.killed and result.returncode == -9 and result.planned == "summary#1+0.15s"
    assert result.landed is not None and result.landed.startswith("at ")
    assert result.landed.endswith("epoch 2's records not yet in metrics.csv, last.ckpt not replaced since its line")
    assert result.seconds < 20


@pytest.mark.slow
def test_one_real_trial_survives_a_kill_before_the_first_checkpoint(tmp_path, capsys):
    """``--kinds spectra --seed 4`` plans one kill for its first trial, right after epoch 0's spectra file appears
    (``spectra#1``): the run has records and no checkpoint, so ``ckpt_path=last`` must set that attempt aside and
    start over by itself, and the finished run must pass every check. The driver (``main``) runs in this process;
    every launch is ``python -m tgo.train`` in a fresh interpreter, as in ``make soak``."""
    args = [
        "--trials",
        "1",
        "--seed",
        "4",
        "--kinds",
        "spectra",
        "--max-epochs",
        "1",
        "--workdir",
        str(tmp_path / "soak"),
        "--launch-timeout",
        "300",  # a hung launch fails the test instead of blocking the suite
    ]
    # One batch, 20 analysis images, no jackknife or probes: the resume machinery is the same, a launch seconds shorter.
    lighter = ["trainer.limit_train_batches=1", "data.analysis.per_class=2", "observation.groups=0"]
    figures = [o for o in NO_FIGURES if o not in soak.FAST]  # every figure off, not only those soak.FAST names
    for override in [*lighter, "observation.probes.enabled=false", *figures]:
        args += ["--override", override]
    code = soak.main(args)
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out + captured.err
    assert "trial 00: spectra#1 killed" in out and "-> OK" in out
    header, row = next((line, out.splitlines()[i + 1]) for i, line in enumerate(out.splitlines()) if "survived" in line)
    assert header.split()[:3] == ["trials", "survived", "lost"]
    assert row.split()[:7] == ["1", "1", "0", "0", "0", "0", "0"]  # trials .. needed a human; leftovers are counted
    assert (tmp_path / "soak" / "trial_00" / "run" / "set_aside").is_dir()  # the attempt was set aside, not deleted
