"""No TGO entry point unpickles arbitrary objects: a checkpoint that would run code is refused, never run.

Every poisoned file here is one of TGO's own checkpoints with one extra entry whose unpickling creates a marker file
(``exec``, the way a hostile pickle runs code, or ``Path.touch``). Each entry point is run on it: resuming with
``ckpt_path=last`` / ``ckpt_path=<file>`` (the real CLI), a poisoned file beside a clean ``last.ckpt``,
``python -m tgo.observe --checkpoint`` (the real CLI), ``--run``, ``--checkpoints`` and ``--timm --weights``. The marker
must never appear; each stops with one line naming the file (status 2), except the file beside ``last.ckpt``, which a
resume skips with a warning naming it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from tests.conftest import compose_train, run_cli
from tests.helpers import TINY_TIMM
from tgo.checkpoints import CheckpointError, load_checkpoint_file, load_weights_file, net_from_checkpoint
from tgo.observe import main as observe_main
from tgo.records import RunDir
from tgo.resume import SET_ASIDE, StartPlan, observed_in_checkpoint, set_aside_newer_checkpoints
from tgo.safe_load import SAFE_GLOBALS, UnsafeCheckpointError, load_weights_only

REFUSED = r"refused, not loaded: unpickling it would call or build '(builtins\.)?exec', which is not a tensor"


class RunsCode:
    """Unpickled, it calls ``exec`` on code that creates ``marker``: what a hostile checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').close()",))


class TouchesAFile:
    """Unpickled, it calls ``pathlib.Path.touch(marker)`` (no ``exec``, no shell)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def poison(clean: Path, target: Path, marker: Path, payload: type = RunsCode, *, legacy: bool = False) -> Path:
    """``target``: the checkpoint ``clean`` with one more entry whose unpickling creates ``marker``."""
    checkpoint = torch.load(clean, map_location="cpu", weights_only=True)
    checkpoint["extra"] = payload(marker)
    torch.save(checkpoint, target, _use_new_zipfile_serialization=not legacy)
    return target


def files(root: Path) -> dict[Path, bytes]:
    """Every file of a run except what Hydra itself writes before tgo.train runs (its config copies, its log)."""
    return {
        p.relative_to(root): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".hydra" not in p.parts and p.name != "train.log"
    }


@pytest.fixture
def run_copy(smoke_run: Path, tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "run")
    shutil.copytree(smoke_run, run.root)
    return run


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


# ------------------------------------------------------------------------------------------- TGO's own checkpoints
def test_tgo_checkpoints_need_nothing_beyond_the_weights_only_set(smoke_run: Path):
    """Hyper-parameters, loop, optimizer and scheduler states, random states and the geometry callback's state all
    load with ``weights_only=True`` and no allow-list."""
    assert SAFE_GLOBALS == []
    paths = sorted(RunDir(smoke_run).checkpoints.glob("*.ckpt"))
    assert [p.name for p in paths] == ["best_epoch_001.ckpt", "last.ckpt"]
    for path in paths:
        assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == [], path
        checkpoint = load_weights_only(path)
        hp = checkpoint["hyper_parameters"]
        assert hp["name"] and hp["img_size"] == 16 and hp["arch"]["embed_dim"] == 32 and isinstance(hp["betas"], tuple)
        assert checkpoint["optimizer_states"] and checkpoint["lr_schedulers"] and checkpoint["loops"]["fit_loop"]
        callbacks = checkpoint["callbacks"]
        (states,) = [v["random_states"] for k, v in callbacks.items() if "RandomStateCheckpoint" in k]
        assert isinstance(states["torch"], torch.Tensor) and len(states["numpy"][1]) == 624
        assert len(states["python"][1]) == 625
        (geometry,) = [v for k, v in callbacks.items() if "SpectralGeometryCallback" in k]
        assert geometry["observed_epochs"]
        assert load_checkpoint_file(path).keys() == checkpoint.keys()
        assert isinstance(net_from_checkpoint(path), torch.nn.Module)
    assert observed_in_checkpoint(RunDir(smoke_run).last_checkpoint) == [0, 1, 2]


# ------------------------------------------------------------------------------------------- the loaders
@pytest.mark.parametrize(
    ("payload", "legacy", "refused"),
    [
        (RunsCode, False, r"(builtins\.)?exec"),
        (RunsCode, True, r"(builtins\.)?exec"),  # torch's legacy, non-zip format: read whole, same unpickler
        (TouchesAFile, False, r"(builtins\.)?getattr|pathlib\.\w+"),  # Path.touch pickles as getattr(Path, 'touch')
    ],
)
def test_every_loader_refuses_a_payload_naming_the_file_and_the_global(smoke_run, tmp_path, payload, legacy, refused):
    marker = tmp_path / "payload_ran"
    bad = poison(RunDir(smoke_run).last_checkpoint, tmp_path / "bad.ckpt", marker, payload, legacy=legacy)
    for load, label in (
        (load_checkpoint_file, str(bad)),
        (net_from_checkpoint, str(bad)),
        (load_weights_file, f"--weights {bad}"),
        (observed_in_checkpoint, f"ckpt_path: '{bad}'"),
    ):
        with pytest.raises(UnsafeCheckpointError) as caught:
            load(bad)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"{label}: refused, not loaded: "), message
        assert re.fullmatch(refused, caught.value.refused) and f"'{caught.value.refused}'" in message
        assert caught.value.path == bad
    assert not marker.exists()
    # The payload is real: torch.load(weights_only=False), what TGO did before, runs it.
    torch.load(bad, map_location="cpu", weights_only=False)
    assert marker.exists()


def test_a_damaged_file_is_still_an_unreadable_checkpoint_not_a_refusal(tmp_path):
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match=r"not a readable PyTorch checkpoint \(UnpicklingError: [^\n]*\)$"):
        load_checkpoint_file(garbage)
    with pytest.raises(CheckpointError, match=r"^--weights .*: not a readable weights file \([^\n]*\)$"):
        load_weights_file(garbage)
    tensor = tmp_path / "tensor.ckpt"
    torch.save(torch.zeros(2), tensor)
    with pytest.raises(CheckpointError, match=r"not a Lightning checkpoint \(it holds a Tensor, not a dict\)"):
        load_checkpoint_file(tensor)


def test_lightnings_own_load_with_weights_only_true_refuses_whatever_the_environment(smoke_run, tmp_path, monkeypatch):
    """What ``trainer.fit(ckpt_path=..., weights_only=True)`` does. With ``weights_only=None`` Lightning leaves the
    choice to torch, whose default (``True`` since 2.6) ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns off; an explicit
    ``True`` holds."""
    marker = tmp_path / "payload_ran"
    bad = poison(RunDir(smoke_run).last_checkpoint, tmp_path / "bad.ckpt", marker)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(Exception, match="Unsupported global"):
        TorchCheckpointIO().load_checkpoint(bad, weights_only=True)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------- resume
@pytest.mark.parametrize("requested", ["last", "file"])
def test_resuming_from_a_poisoned_checkpoint_is_one_line_with_status_2_and_nothing_done(run_copy, tmp_path, requested):
    """``python -m tgo.train ckpt_path=last`` with a poisoned ``last.ckpt``, or ``ckpt_path=<a poisoned file>``."""
    marker = tmp_path / "payload_ran"
    if requested == "last":
        bad = run_copy.last_checkpoint
        poison(run_copy.last_checkpoint, bad, marker)
    else:
        bad = poison(run_copy.last_checkpoint, tmp_path / "handed_over.ckpt", marker)
    before = files(run_copy.root)
    ckpt_path = "last" if requested == "last" else str(bad)
    result = run_cli(["experiment=smoke", f"hydra.run.dir={run_copy.root}", f"ckpt_path={ckpt_path}"], cwd=tmp_path)
    assert not marker.exists()
    assert result.returncode == 2, result.stderr[-3000:]
    assert re.match(rf"tgo\.train: error: ckpt_path: '{re.escape(str(bad))}': {REFUSED}", one_line(result.stderr))
    assert files(run_copy.root) == before  # nothing moved, removed or rewritten
    assert not (run_copy.root / SET_ASIDE).exists()


def test_a_poisoned_file_beside_last_ckpt_is_skipped_with_a_warning_and_the_resume_goes_on(run_copy, tmp_path):
    from tgo.train import run

    marker = tmp_path / "payload_ran"
    bad = poison(run_copy.last_checkpoint, run_copy.checkpoints / "dropped_here.ckpt", marker)
    cfg = compose_train(run_copy.root, ["experiment=smoke", "observation.figures.heatmaps=false", "ckpt_path=last"])
    with pytest.warns(RuntimeWarning, match=rf"\[tgo\] resume: skipped {re.escape(str(bad))}: {REFUSED}") as caught:
        metrics = run(cfg)
    assert not marker.exists()
    assert isinstance(metrics, dict)  # the resume went on: restored last.ckpt and stopped (the run was finished)
    assert bad.is_file() and not (run_copy.root / SET_ASIDE).exists()  # left where it was, not moved aside
    assert sum(str(bad) in str(w.message) for w in caught) == 1


def test_the_checkpoint_scan_skips_a_poisoned_file_and_still_sets_aside_newer_ones(run_copy, tmp_path):
    marker = tmp_path / "payload_ran"
    bad = poison(run_copy.last_checkpoint, run_copy.checkpoints / "dropped_here.ckpt", marker)
    torch.save({"global_step": 10**6}, run_copy.checkpoints / "best_epoch_009.ckpt")  # saved after last.ckpt
    with pytest.warns(RuntimeWarning, match=rf"skipped {re.escape(str(bad))}: {REFUSED}"):
        newer = set_aside_newer_checkpoints(run_copy, run_copy.last_checkpoint)
    assert [p.name for p in newer] == ["best_epoch_009.ckpt"] and bad.is_file()
    assert not marker.exists()


def test_prepare_refuses_a_poisoned_checkpoint_before_touching_anything(run_copy, tmp_path):
    marker = tmp_path / "payload_ran"
    poison(run_copy.last_checkpoint, run_copy.last_checkpoint, marker)
    left = run_copy.checkpoints / ".last.ckpt.x1.tmp"
    left.write_bytes(b"partial")
    with pytest.raises(UnsafeCheckpointError, match=REFUSED):
        StartPlan("last").prepare(run_copy, str(run_copy.last_checkpoint))
    assert left.is_file() and not marker.exists() and not (run_copy.root / SET_ASIDE).exists()


# ------------------------------------------------------------------------------------------- observe
def test_observe_checkpoint_refuses_a_poisoned_file_in_one_line_with_status_2(smoke_run, tmp_path):
    """The real ``python -m tgo.observe --checkpoint`` CLI."""
    import subprocess
    import sys

    from tests.conftest import REPO

    marker = tmp_path / "payload_ran"
    bad = poison(RunDir(smoke_run).last_checkpoint, tmp_path / "bad.ckpt", marker)
    out = tmp_path / "observed"
    result = subprocess.run(
        [sys.executable, "-m", "tgo.observe", "--checkpoint", str(bad), "--out", str(out)],
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not marker.exists()
    assert result.returncode == 2, result.stderr[-3000:]
    assert re.match(rf"tgo\.observe: error: {re.escape(str(bad))}: {REFUSED}", one_line(result.stderr))
    assert not out.exists()


@pytest.mark.parametrize("option", ["--run", "--checkpoints"])
def test_observe_of_a_run_with_a_poisoned_checkpoint_names_it_in_one_line(run_copy, tmp_path, capsys, option):
    marker = tmp_path / "payload_ran"
    bad = poison(run_copy.last_checkpoint, run_copy.checkpoints / "dropped_here.ckpt", marker)
    where = run_copy.root if option == "--run" else run_copy.checkpoints
    assert observe_main([option, str(where), "--out", str(tmp_path / "observed")]) == 2
    assert re.match(rf"tgo\.observe: error: {re.escape(str(bad))}: {REFUSED}", one_line(capsys.readouterr().err))
    assert not marker.exists() and not (tmp_path / "observed").exists()


def test_observe_timm_weights_refuses_a_poisoned_file_in_one_line(smoke_run, tmp_path, capsys):
    marker = tmp_path / "payload_ran"
    bad = poison(RunDir(smoke_run).last_checkpoint, tmp_path / "weights.pth", marker)
    argv = ["--timm", "vit_tiny_patch16_224", "--weights", str(bad), "--out", str(tmp_path / "observed"), *TINY_TIMM]
    assert observe_main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert re.match(rf"tgo\.observe: error: --weights {re.escape(str(bad))}: {REFUSED}", line), line
    assert not marker.exists()
