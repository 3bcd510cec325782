"""Damaged record files: ``python -m tgo.report`` answers with one line naming the file, exit status 2, no traceback.

tgo never writes such files itself (records are written atomically, an epoch's rows are replaced when it is observed
again), so each case stands for a file damaged or edited after the run: a truncated spectra archive, a binary
``metrics.csv``, two rows for one observable.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.report.synthetic import write_synthetic_run
from tgo.records import RunDir
from tgo.report.__main__ import main


def _run(tmp_path: Path) -> RunDir:
    curves = {"effective_rank": {"cls": lambda e: 1.0 + e}}
    return RunDir(write_synthetic_run(tmp_path / "run", curves, epochs=[0, 1, 2]))


def _truncate_spectra(run: RunDir) -> Path:
    path = run.spectra(1)
    path.write_bytes(path.read_bytes()[:200])
    return path


def _binary_metrics(run: RunDir) -> Path:
    run.metrics.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 40)
    return run.metrics


def _duplicate_row(run: RunDir) -> Path:
    lines = run.metrics.read_text(encoding="utf-8").splitlines()
    run.metrics.write_text(
        "\n".join([*lines, lines[2]]) + "\n", encoding="utf-8"
    )  # epoch 1's row again, as a concatenation would
    return run.metrics


@pytest.mark.parametrize(
    ("damage", "what"),
    [
        (_truncate_spectra, r"unreadable spectra file \(BadZipFile"),
        (_binary_metrics, "not a readable CSV text file"),
        (_duplicate_row, r"line 5 repeats epoch 1, point cls, view all, metric effective_rank of line 3"),
    ],
    ids=["truncated-npz", "binary-metrics", "duplicate-row"],
)
def test_a_damaged_record_file_is_one_line_naming_it_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage, what: str
):
    run = _run(tmp_path)
    path = damage(run)
    assert main([str(run.root), "--no-correlation"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tgo.report: error: {path}: "), err
    assert re.search(what, err), err
    assert not (run.report / "index.html").exists(), "no report from damaged records"


def test_a_report_never_replaces_files_it_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    run = _run(tmp_path)
    theirs = run.report / "index.html"
    theirs.parent.mkdir()
    theirs.write_text("<html>my own notes</html>", encoding="utf-8")
    assert main([str(run.root)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already holds files TGO did not write (index.html)" in err
    assert theirs.read_text(encoding="utf-8") == "<html>my own notes</html>", "nothing replaced"
    assert sorted(p.name for p in run.report.iterdir()) == ["index.html"], "nothing written beside it"

    mine = tmp_path / "mine"
    assert main([str(run.root), "--out", str(mine), "--no-correlation"]) == 0
    assert (mine / ".tgo-report").is_file()
    assert main([str(run.root), "--out", str(mine), "--no-correlation"]) == 0, "a report replaces its own report"

    (mine / ".tgo-report").unlink()  # a report written before the marker existed: only report files, TGO's page
    assert main([str(run.root), "--out", str(mine), "--no-correlation"]) == 0
    (mine / "notes.txt").write_text("mine", encoding="utf-8")
    (mine / ".tgo-report").unlink()
    assert main([str(run.root), "--out", str(mine), "--no-correlation"]) == 2
    assert "(notes.txt)" in capsys.readouterr().err
