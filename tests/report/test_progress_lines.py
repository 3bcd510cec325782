"""``tgo-report`` is never silent for long: one line per step on stderr as it finishes (the runs read, the verdicts,
each section with the figures it drew, the page), none with ``--quiet``; the page's path stays on stdout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.report.test_build import two_seeds
from tgo.report.__main__ import main
from tgo.report.build import PUBLISHED_SECTIONS, SECTIONS

SECTION_LINE = re.compile(r"^\[tgo\] report: section (\w+): (\d+) figures? in \d+\.\d s$")


def _section_lines(err: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for line in err.splitlines() if (m := SECTION_LINE.match(line))}


def test_each_step_and_section_prints_one_line_with_its_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    runs = [str(p) for p in two_seeds(tmp_path)]
    assert main([*runs, "--out", str(tmp_path / "report"), "--no-correlation"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert re.match(r"^\[tgo\] report: read 2 runs in \d+\.\d s$", lines[0])
    assert re.match(r"^\[tgo\] report: judged the claims and predictions in \d+\.\d s$", lines[1])
    assert re.match(r"^\[tgo\] report: wrote the page and the CSVs in \d+\.\d s$", lines[-1])
    sections = _section_lines(captured.err)
    assert list(sections) == [make.__name__.removesuffix("_section") for make in SECTIONS]  # in the page's order
    assert sum(sections.values()) == len(list((tmp_path / "report" / "figures").glob("*.png")))
    assert sum(sections.values()) > 0
    assert "report/index.html" in captured.out


def test_quiet_prints_only_the_pages_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["--published", "--out", str(tmp_path / "paper"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "paper/index.html" in captured.out
    assert main(["--published", "--out", str(tmp_path / "again")]) == 0
    assert list(_section_lines(capsys.readouterr().err)) == [
        make.__name__.removesuffix("_section") for make in PUBLISHED_SECTIONS
    ]
