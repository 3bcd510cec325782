"""``tgo-observe`` shows rank 0's analysis batches as a bar on a terminal's stderr (tqdm's convention: none in a log
file, where the per-model line suffices)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

import tgo.observe as observe_module
from tests.helpers import TINY_TIMM
from tgo.observe import main
from tgo.progress import terminal_progress


def test_a_terminal_gets_a_bar_of_the_batches_and_a_log_file_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    terminal = io.StringIO()
    monkeypatch.setattr(
        observe_module, "terminal_progress", lambda what: terminal_progress(what, file=terminal, enabled=True)
    )
    args = ["--timm", "vit_tiny_patch16_224", "--out", str(tmp_path / "a"), *TINY_TIMM, "observation.batch_size=8"]
    assert main(args) == 0
    bar = terminal.getvalue()
    assert "observing vit_tiny_patch16_224" in bar
    assert re.search(r"\b3/3\b", bar)  # 20 images in batches of 8
    monkeypatch.undo()
    assert main([*args[:3], str(tmp_path / "b"), *args[4:]]) == 0
    assert "observing" not in capsys.readouterr().err  # stderr is not a terminal here
