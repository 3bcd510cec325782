"""The examples run end to end as a user runs them: a subprocess, records on disk, the report on the output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tgo.records import RunDir, recorded_epochs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_library_example_marks_its_few_tgo_lines() -> None:
    """The lines a user adds to their own training for TGO: two imports, the subset, the callback, the argument."""
    lines = (EXAMPLES / "own_lightning.py").read_text().splitlines()
    tgo_lines = [line.strip() for line in lines if line.rstrip().endswith("# TGO")]
    assert len(tgo_lines) == 5, tgo_lines
    assert not any(line.startswith(("import hydra", "from hydra")) for line in lines), "no Hydra"


@pytest.mark.slow
def test_own_lightning_example_records_and_the_report_reads_its_output(tmp_path: Path) -> None:
    out = tmp_path / "own_lightning"
    subprocess.run(
        [sys.executable, str(EXAMPLES / "own_lightning.py"), str(out), "--epochs", "1", "--batches", "4"],  # at 0, 1
        check=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert recorded_epochs(out) == [0, 1]
    manifest = json.loads(RunDir(out).manifest.read_text())
    assert manifest["size"] == 100 and manifest["num_classes"] == 10 and manifest["per_class"] == 10
    report = subprocess.run(
        [sys.executable, "-m", "tgo.report", str(out), "--no-correlation"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert report.returncode == 0, report.stderr
    assert (RunDir(out).report / "index.html").is_file()
    assert not (tmp_path / "geometry").exists(), "records go to the directory given, not the working directory"
