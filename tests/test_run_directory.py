"""Nothing a user made is overwritten, a mistyped resume is refused, and every bad start is one line (issue 20)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import compose_train, run_cli
from tgo.config import validate_config
from tgo.errors import ConfigError
from tgo.records import RunDir
from tgo.train import _original_message, check_run_directory, error_line, mark_run_directory, preflight


def users_directory(tmp_path: Path) -> Path:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("my own settings\n")
    (mine / "notes.txt").write_text("do not touch\n")
    return mine


def test_a_directory_the_user_made_is_refused_and_left_as_it_was(tmp_path: Path):
    mine = users_directory(tmp_path)
    for ckpt in (None, "last"):
        with pytest.raises(ConfigError, match=r"holds files TGO did not make \(config.yaml, notes.txt\)"):
            check_run_directory(mine, ckpt)
    assert (mine / "config.yaml").read_text() == "my own settings\n" and sorted(os.listdir(mine)) == [
        "config.yaml",
        "notes.txt",
    ]


def test_new_empty_hydra_only_marked_and_earlier_runs_are_used(tmp_path: Path):
    check_run_directory(tmp_path / "new", None)
    hydra_only = tmp_path / "hydra_only"
    (hydra_only / ".hydra").mkdir(parents=True)
    (hydra_only / "train.log").write_text("")
    check_run_directory(hydra_only, None)
    marked = tmp_path / "marked"
    marked.mkdir()
    mark_run_directory(marked)
    assert RunDir(marked).is_marked()
    first = RunDir(marked).marker.read_bytes()
    mark_run_directory(marked)  # never rewritten
    assert RunDir(marked).marker.read_bytes() == first
    (marked / "anything").write_text("")
    check_run_directory(marked, "last")
    legacy = tmp_path / "legacy"  # a run made before the marker: its manifest says it is TGO's
    legacy.mkdir()
    (legacy / RunDir.MANIFEST).write_text("{}")
    check_run_directory(legacy, None)


def test_resuming_a_directory_that_did_not_exist_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"ckpt_path=last: hydra.run.dir '.*typo' did not exist"):
        check_run_directory(tmp_path / "typo", "last")
    made_now = tmp_path / "made_now"  # what Hydra made for this launch, a moment ago
    (made_now / ".hydra").mkdir(parents=True)
    with pytest.raises(ConfigError, match="did not exist before this launch"):
        check_run_directory(made_now, "last", launched_at=0.0)
    # a launch killed during start-up left Hydra's files: its relaunch goes on (and starts the run over)
    check_run_directory(made_now, "last", launched_at=float("inf"))


def test_preflight_refuses_a_file_a_read_only_or_full_filesystem_before_hydra(tmp_path: Path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert "is a file" in str(preflight([f"hydra.run.dir={afile}"]))
    assert "is a file" in str(preflight([f"hydra.run.dir={afile}/run"]))
    assert "holds files TGO did not make" in str(preflight([f"hydra.run.dir={users_directory(tmp_path)}"]))
    assert "did not exist" in str(preflight(["ckpt_path=last", f"hydra.run.dir={tmp_path / 'typo'}"]))
    assert preflight([f"hydra.run.dir={tmp_path / 'new'}"]) is None
    assert "MiB free" in str(preflight([f"hydra.run.dir={tmp_path / 'new'}"], min_free=2**62))
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    assert "is not writable" in str(preflight([f"paths.log_dir={tmp_path / 'logs'}"]))


def test_a_negative_seed_is_one_line_before_any_work(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"seed: expected an integer in \[0, 2\*\*32 - 1\].*got -1"):
        validate_config(compose_train(tmp_path / "run", ["experiment=smoke", "seed=-1"]))


def test_a_multi_line_message_keeps_the_line_that_names_the_culprit():
    error = ConfigError(
        "unknown module path(s) for observation point(s) in VisionTransformer:\n  point 'foo': no module"
    )
    assert (
        _original_message(error)
        == "unknown module path(s) for observation point(s) in VisionTransformer: point 'foo': no module"
    )
    worker = ValueError(
        "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback:\n  ...\nValueError: bad image x"
    )
    assert _original_message(worker) == "bad image x"
    assert error_line(error) is not None and "\n" not in str(error_line(error))


def test_the_cli_refuses_a_users_directory_in_one_line_without_writing_there(tmp_path: Path):
    mine = users_directory(tmp_path)
    result = run_cli(["experiment=smoke", f"hydra.run.dir={mine}"], cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"tgo.train: error: hydra.run.dir: '{mine}' holds files TGO did not make (config.yaml, notes.txt) and is not "
        f"a TGO run (no {RunDir.MARKER}); expected a new or empty directory, or a run to resume: choose another "
        "directory"
    ]
    assert sorted(os.listdir(mine)) == ["config.yaml", "notes.txt"]  # not even Hydra's .hydra/
    typo = tmp_path / "typo"
    result = run_cli(["experiment=smoke", "ckpt_path=last", f"hydra.run.dir={typo}"], cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "did not exist before this launch" in result.stderr and not typo.exists()
