"""The pin of issue 35: rebuilding the default run's and the published data's reports gives the same numbers.

`tests.report.report_numbers` stored them before the report became one pipeline: ``findings.csv`` and
``hypotheses.csv`` cell by cell, and every number of the page's visible text in reading order, compared by value and
then as written. A change meant to move a number regenerates the fixture (``python -m tests.report.report_numbers``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.report.report_numbers import build_default_run, build_published, load, snapshot


def _value(token: str) -> float:
    return float(token.replace("−", "-").rstrip("%"))


def _same_numbers(got: list[str], want: list[str]) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        a, b = _value(g), _value(w)
        assert a == b or (math.isnan(a) and math.isnan(b)), f"number {i}: {g} (was {w}) after {got[i - 8 : i]}"
    assert len(got) == len(want), f"{len(got)} numbers on the page, {len(want)} before"
    assert got == want  # the same values, written the same way


def _same_cells(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, rows in want.items():
        assert got[name][0] == rows[0], f"{name}: columns"
        assert len(got[name]) == len(rows), f"{name}: {len(got[name]) - 1} rows, {len(rows) - 1} before"
        for i, (g, w) in enumerate(zip(got[name][1:], rows[1:], strict=True), start=1):
            for column, a, b in zip(rows[0], g, w, strict=True):
                assert a == b, f"{name} row {i} ({w[:4]}) column {column}: {a!r}, was {b!r}"


@pytest.mark.filterwarnings("ignore:No artists with labels")
def test_the_default_runs_report_shows_the_numbers_it_showed(tmp_path: Path):
    run, report = build_default_run(tmp_path)
    got, want = snapshot(report, run), load("default_run")
    _same_cells(got["csv"], want["csv"])
    _same_numbers(got["page"], want["page"])


def test_the_published_report_shows_the_numbers_it_showed(tmp_path: Path):
    got, want = snapshot(build_published(tmp_path)), load("published")
    _same_cells(got["csv"], want["csv"])
    _same_numbers(got["page"], want["page"])
