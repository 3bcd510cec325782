"""Nothing a user made is overwritten, a mistyped resume is refused, and every bad start is one line (issue 20)."""

from __future__ import annotations

import json
import os
import shutil
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
    (mine / "config.yaml").write_text("my own settings\n", encoding="utf-8")
    (mine / "notes.txt").write_text("do not touch\n", encoding="utf-8")
    return mine


def test_a_directory_the_user_made_is_refused_and_left_as_it_was(tmp_path: Path):
    mine = users_directory(tmp_path)
    for ckpt in (None, "last"):
        with pytest.raises(ConfigError, match=r"holds files TGO did not make \(config.yaml, notes.txt\)"):
            check_run_directory(mine, ckpt)
    assert (mine / "config.yaml").read_text(encoding="utf-8") == "my own settings\n" and sorted(os.listdir(mine)) == [
        "config.yaml",
        "notes.txt",
    ]


def test_new_empty_hydra_only_marked_and_earlier_runs_are_used(tmp_path: Path):
    check_run_directory(tmp_path / "new", None)
    hydra_only = tmp_path / "hydra_only"
    (hydra_only / ".hydra").mkdir(parents=True)
    (hydra_only / "train.log").write_text("", encoding="utf-8")
    check_run_directory(hydra_only, None)
    marked = tmp_path / "marked"
    marked.mkdir()
    mark_run_directory(marked)
    assert RunDir(marked).is_marked()
    first = RunDir(marked).marker.read_bytes()
    mark_run_directory(marked)  # never rewritten
    assert RunDir(marked).marker.read_bytes() == first
    (marked / "anything").write_text("", encoding="utf-8")
    check_run_directory(marked, "last")
    legacy = tmp_path / "legacy"  # a run made before the marker: its manifest says it is TGO's
    legacy.mkdir()
    (legacy / RunDir.MANIFEST).write_text("{}", encoding="utf-8")
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
    afile.write_text("", encoding="utf-8")
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
        f"a TGO run (no {RunDir.MARKER} made for it); expected a new or empty directory, or a run to resume: choose "
        "another directory"
    ]
    assert sorted(os.listdir(mine)) == ["config.yaml", "notes.txt"]  # not even Hydra's .hydra/
    typo = tmp_path / "typo"
    result = run_cli(["experiment=smoke", "ckpt_path=last", f"hydra.run.dir={typo}"], cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "did not exist before this launch" in result.stderr and not typo.exists()


def test_a_copied_marker_does_not_make_a_users_directory_a_run(tmp_path: Path):
    """Issue 33: a ``.tgo-run`` copied into a user's directory made tgo.train overwrite their config.yaml. The marker
    names the directory it was made for, so a copy (or one of a run moved elsewhere) does not count."""
    run = tmp_path / "run"
    run.mkdir()
    mark_run_directory(run)
    stamp = json.loads(RunDir(run).marker.read_text(encoding="utf-8"))
    assert stamp["path"] == os.path.realpath(run) and stamp["kind"] == "train" and len(stamp["run_id"]) == 32
    mine = users_directory(tmp_path)
    shutil.copy(RunDir(run).marker, mine / RunDir.MARKER)
    assert not RunDir(mine).is_marked()
    with pytest.raises(ConfigError, match=r"is not a TGO run \(its .tgo-run was made for another directory\)"):
        check_run_directory(mine, None)
    assert (mine / "config.yaml").read_text(encoding="utf-8") == "my own settings\n"
    moved = tmp_path / "moved"  # a run moved elsewhere is still one by its records, and is marked again there
    (moved / "geometry").mkdir(parents=True)
    (moved / "geometry" / "metrics.csv").write_text("epoch,step,point,view,metric,value,stderr\n", encoding="utf-8")
    shutil.copy(RunDir(run).marker, moved / RunDir.MARKER)
    check_run_directory(moved, None)
    mark_run_directory(moved)
    assert (
        RunDir(moved).is_marked()
        and json.loads(RunDir(moved).marker.read_text(encoding="utf-8"))["run_id"] != stamp["run_id"]
    )


def _marker_a_directory(run: Path) -> str:
    (run / RunDir.MARKER).unlink()
    (run / RunDir.MARKER).mkdir()
    return ".tgo-run is a directory (or another non-file); expected a file of TGO's"


def _weights_a_file(run: Path) -> str:
    (run / "geometry").mkdir()
    (run / "geometry" / "weights").write_text("not a directory", encoding="utf-8")
    return "geometry/weights is a file; expected a directory TGO writes into"


def _geometry_a_link(run: Path) -> str:
    elsewhere = run.parent / "elsewhere"
    elsewhere.mkdir()
    (run / "geometry").symlink_to(elsewhere)
    return f"geometry is a symbolic link (to {elsewhere})"


def _config_a_link(run: Path) -> str:
    theirs = run.parent / "their_config.yaml"
    theirs.write_text("theirs\n", encoding="utf-8")
    (run / "config.yaml").symlink_to(theirs)
    return f"config.yaml is a symbolic link (to {theirs})"


def _a_spectra_file_a_link(run: Path) -> str:
    theirs = run.parent / "theirs.npz"
    theirs.write_bytes(b"theirs")
    (run / "geometry" / "spectra").mkdir(parents=True)
    (run / "geometry" / "spectra" / "epoch_0001.npz").symlink_to(theirs)
    return f"geometry/spectra/epoch_0001.npz is a symbolic link (to {theirs})"


@pytest.mark.parametrize(
    "plant", [_marker_a_directory, _weights_a_file, _geometry_a_link, _config_a_link, _a_spectra_file_a_link]
)
def test_what_tgo_would_write_through_or_fail_on_mid_run_is_refused_in_one_line_before_work(tmp_path: Path, plant):
    """Issue 33: ``geometry/weights`` a file was an 87-line traceback mid-run, ``.tgo-run`` a directory a traceback;
    a link inside the run would send TGO's writes outside it. Each is one line before anything is written, for a
    fresh run and a resume, before Hydra (`preflight`) as after."""
    run = tmp_path / "run"
    run.mkdir()
    mark_run_directory(run)
    expected = plant(run)
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    for ckpt in (None, "last"):
        with pytest.raises(ConfigError) as refused:
            check_run_directory(run, ckpt)
        assert "\n" not in str(refused.value) and f"hydra.run.dir: '{run}': {expected}; TGO never writes" in str(
            refused.value
        )
    assert expected in str(preflight([f"hydra.run.dir={run}"]))
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before, "nothing written"
