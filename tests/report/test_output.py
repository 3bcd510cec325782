"""Where ``python -m tgo.report`` writes (issue 33): a report is one unit, never written through a link, and an output
it cannot write is one line.

Before: links planted in ``--out`` (``index.html``, ``findings.csv``, a figure) were written through, overwriting files
outside it; SIGTERM while re-reporting into an old report's directory left run A's page beside figures of run B; a
read-only ``--out`` was a traceback. Now the report is built in a temporary sibling and swapped in whole
(`tgo.report.output`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import terminate_when
from tests.report.synthetic import write_synthetic_run
from tgo.report.__main__ import main
from tgo.report.output import REPORT_MARKER

REPO = Path(__file__).resolve().parents[2]


def _run(path: Path, slope: float = 1.0, epochs: int = 3) -> Path:
    curves = {"effective_rank": {"cls": lambda e: 1.0 + slope * e, "block_01": lambda e: 2.0 - 0.1 * slope * e}}
    return write_synthetic_run(path, curves, epochs=list(range(epochs)))


def _contents(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by its relative path: its SHA-256 (a link: where it points)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            found[key] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tgo.report: error: "), err
    return err.strip()


@pytest.fixture
def old_report(tmp_path: Path) -> Path:
    """A finished report of run A in ``tmp_path/out``."""
    out = tmp_path / "out"
    assert main([str(_run(tmp_path / "A")), "--out", str(out), "--no-correlation"]) == 0
    assert (out / REPORT_MARKER).is_file() and list((out / "figures").glob("*.png"))
    return out


@pytest.mark.parametrize("planted", ["index.html", "findings.csv", "figure"])
def test_links_planted_in_the_output_are_refused_and_what_they_point_to_is_untouched(
    old_report: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], planted: str
):
    victim = tmp_path / "victim.txt"
    victim.write_text("a file outside the report", encoding="utf-8")
    name = next(iter(sorted((old_report / "figures").glob("*.png")))).name if planted == "figure" else planted
    target = old_report / "figures" / name if planted == "figure" else old_report / name
    target.unlink()
    target.symlink_to(victim)
    before = _contents(old_report)
    assert main([str(_run(tmp_path / "B", slope=2.0)), "--out", str(old_report), "--no-correlation"]) == 2
    line = _one_line(capsys)
    shown = f"figures/{name}" if planted == "figure" else name
    assert f"report output {old_report} holds symbolic links ({shown}); a report never writes through a link" in line
    assert victim.read_text(encoding="utf-8") == "a file outside the report" and _contents(old_report) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [], "no temporary left beside"


def test_an_output_that_is_a_link_is_refused(old_report: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    link = tmp_path / "link"
    link.symlink_to(old_report)
    before = _contents(old_report)
    assert main([str(_run(tmp_path / "B", slope=2.0)), "--out", str(link), "--no-correlation"]) == 2
    assert f"report output {link} is a symbolic link (to {old_report})" in _one_line(capsys)
    assert _contents(old_report) == before and link.is_symlink()


def test_a_report_replaces_the_old_one_whole(old_report: Path, tmp_path: Path):
    before = _contents(old_report)
    assert main([str(_run(tmp_path / "B", slope=2.0, epochs=4)), "--out", str(old_report), "--no-correlation"]) == 0
    after = _contents(old_report)
    assert after != before and after.keys() >= {REPORT_MARKER, "index.html", "findings.csv", "hypotheses.csv"}
    assert "B" in (old_report / "index.html").read_text(encoding="utf-8") and sorted(
        p.name for p in tmp_path.iterdir()
    ) == [
        "A",
        "B",
        "out",
    ], "nothing left beside the report"


def test_a_report_that_fails_half_way_leaves_the_old_one_whole(old_report: Path, tmp_path: Path, monkeypatch):
    before = _contents(old_report)
    drawn = []

    def fail_after_some_figures(*args, **kwargs):
        drawn.append(1)
        raise RuntimeError("the machine failed half-way through the figures")

    monkeypatch.setattr("tgo.report.sections.spectrum_figures", fail_after_some_figures)
    with pytest.raises(RuntimeError, match="half-way"):
        main([str(_run(tmp_path / "B", slope=2.0)), "--out", str(old_report), "--no-correlation"])
    assert drawn and _contents(old_report) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A", "B", "out"], "the half-built copy is removed"


def test_sigterm_while_re_reporting_leaves_the_old_report_whole(old_report: Path, tmp_path: Path):
    """A real process, stopped by a real SIGTERM once its new figures are being drawn (before its page exists)."""
    before = _contents(old_report)
    run_b = _run(tmp_path / "B", slope=2.0, epochs=12)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tgo.report", str(run_b), "--out", str(old_report)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    returncode, stderr = terminate_when(
        proc, lambda: any(tmp_path.glob(".out.tgo-building-*/figures/*.png")), "the report", limit_s=120
    )
    assert returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].startswith("tgo.report: stopped by SIGTERM: the output directory holds a")
    assert _contents(old_report) == before, "run A's report, every file as it was"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A", "B", "out"], "the half-built copy is removed"


def test_a_foreign_file_in_an_old_report_is_refused(old_report: Path, tmp_path: Path, capsys):
    (old_report / "notes.txt").write_text("mine", encoding="utf-8")
    before = _contents(old_report)
    assert main([str(_run(tmp_path / "B")), "--out", str(old_report), "--no-correlation"]) == 2
    assert "already holds files TGO did not write (notes.txt)" in _one_line(capsys)
    assert _contents(old_report) == before


# ------------------------------------------------------------------------------------------ read-only filesystems
@contextlib.contextmanager
def _read_only_mount(folder: Path) -> Iterator[None]:
    """``folder`` as a tmpfs remounted read-only for the block (needs root and a mount namespace that allows it)."""
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(folder)], check=False).returncode:
        pytest.skip("a real read-only filesystem needs root and mount (the simulated case below runs everywhere)")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _remount_read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


def test_a_read_only_filesystem_is_one_line_for_the_output_and_for_its_parent(tmp_path, capsys):
    ro = tmp_path / "ro"
    run = _run(tmp_path / "A")
    with _read_only_mount(ro):
        existing = ro / "old"
        assert main([str(run), "--out", str(existing), "--no-correlation"]) == 0
        capsys.readouterr()  # its progress lines
        before = _contents(existing)
        _remount_read_only(ro)
        assert main([str(run), "--out", str(existing), "--no-correlation"]) == 2  # an old report on it
        line = _one_line(capsys)
        assert line.startswith(f"tgo.report: error: report output {existing}: cannot write in {ro} (a read-only ")
        assert _contents(existing) == before
        assert main([str(run), "--out", str(ro / "new"), "--no-correlation"]) == 2  # a new one in it
        assert f"report output {ro / 'new'}: cannot write in {ro} (a read-only filesystem)" in _one_line(capsys)


def test_an_output_that_cannot_be_written_is_one_line_anywhere(tmp_path, capsys, monkeypatch):
    """The same refusal where a real read-only mount cannot be made: the filesystem's EROFS, simulated."""

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    out = tmp_path / "out"
    assert main([str(_run(tmp_path / "A")), "--out", str(out), "--no-correlation"]) == 2
    assert f"report output {out}: cannot write in {tmp_path} (a read-only filesystem)" in _one_line(capsys)
    assert not out.exists()
