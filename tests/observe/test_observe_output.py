"""``python -m tgo.observe --out``: only a new, empty or TGO directory is written, never through a link, one process
at a time (issue 33: ``--out <a user's directory>`` overwrote the user's ``config.yaml`` and exited 0)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.helpers import TINY_TIMM
from tests.test_run_lock import holding_lock
from tgo.observe import main
from tgo.records import RunDir, recorded_epochs
from tgo.run_lock import LOCK_NAME

TIMM = ["--timm", "vit_tiny_patch16_224", "--seed", "3"]


def users_directory(tmp_path: Path) -> Path:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("my own settings\n", encoding="utf-8")
    return mine


def _refused(out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Runs the CLI into ``out``; it must refuse with status 2 and one line, and write nothing there."""
    before = sorted((str(p.relative_to(out)), p.is_symlink()) for p in out.rglob("*"))
    assert main([*TIMM, "--out", str(out), *TINY_TIMM]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tgo.observe: error: --out ") and str(out) in err, err
    assert sorted((str(p.relative_to(out)), p.is_symlink()) for p in out.rglob("*")) == before, "nothing written"
    return err


def test_a_users_directory_is_refused_and_its_config_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    mine = users_directory(tmp_path)
    err = _refused(mine, capsys)
    assert "holds files TGO did not make (config.yaml) and is not a TGO run; expected a new or empty directory" in err
    assert (mine / "config.yaml").read_text(encoding="utf-8") == "my own settings\n"


def test_a_copied_marker_does_not_make_a_directory_tgos(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    run = tmp_path / "run"
    run.mkdir()
    RunDir(run).mark("train")
    mine = users_directory(tmp_path)
    shutil.copy(RunDir(run).marker, mine / RunDir.MARKER)
    err = _refused(mine, capsys)
    assert "is not a TGO run (its .tgo-run was made for another directory)" in err
    assert (mine / "config.yaml").read_text(encoding="utf-8") == "my own settings\n"


def test_links_and_a_weights_file_inside_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    theirs = tmp_path / "theirs.yaml"
    theirs.write_text("theirs\n", encoding="utf-8")
    linked = tmp_path / "linked"
    linked.mkdir()
    RunDir(linked).mark("observe")
    (linked / "config.yaml").symlink_to(theirs)
    assert f"config.yaml is a symbolic link (to {theirs}); TGO never writes through a link" in _refused(linked, capsys)
    assert theirs.read_text(encoding="utf-8") == "theirs\n"
    weights = tmp_path / "weights"
    (weights / "geometry").mkdir(parents=True)
    RunDir(weights).mark("observe")
    (weights / "geometry" / "weights").write_text("a file", encoding="utf-8")
    assert "geometry/weights is a file; expected a directory TGO writes into" in _refused(weights, capsys)


def test_a_directory_another_process_writes_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "out"
    with holding_lock(out) as first:
        err = _refused(out, capsys)
    assert f"--out '{out}' is in use by another TGO process (pid {first.pid} on host " in err


def test_a_new_directory_is_marked_as_an_observation_and_its_lock_released(tmp_path: Path):
    out = tmp_path / "new"
    assert main([*TIMM, "--out", str(out), *TINY_TIMM]) == 0
    stamp = json.loads(RunDir(out).marker.read_text(encoding="utf-8"))
    assert stamp["kind"] == "observe" and stamp["path"] == os.path.realpath(out)
    assert not (out / LOCK_NAME).exists()
    written = [".tgo-run", "analysis_subset.json", "config.yaml", "geometry", "run_description.json"]
    assert sorted(p.name for p in out.iterdir()) == written


def test_sigterm_ends_an_observation_in_one_line_with_status_143_and_the_lock_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """A real SIGTERM, sent to this process once the first model's records are written (before: the default action
    killed the process, no message, and the lock file stayed behind for the next run to take over)."""
    import tgo.observe

    real = tgo.observe.observe_and_record

    def then_terminated(*args, **kwargs):
        results = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return results

    monkeypatch.setattr(tgo.observe, "observe_and_record", then_terminated)
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGTERM)
    assert main([*TIMM, "--out", str(out), *TINY_TIMM]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"tgo.observe: stopped by SIGTERM: the records of epochs [0] in {out} are whole; the other models were not "
        "observed (observe them into a new --out)"
    )
    assert recorded_epochs(out) == [0] and not (out / LOCK_NAME).exists()
    assert signal.getsignal(signal.SIGTERM) is before, "the previous handler is back"
