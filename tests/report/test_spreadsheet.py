"""The report's CSV files are safe to open in a spreadsheet: a cell it would execute is written as text, numbers stay
numbers (OWASP's CSV-injection rule)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tgo.report.spreadsheet import FORMULA_STARTS, spreadsheet_cell, write_csv

FORMULAS = ["=1+1", '=HYPERLINK("http://x","y")', "+cmd|' /C calc'!A0", "-2+3", "-cmd", "@SUM(A1)", "\tx", "\r=1"]
NUMBERS = ["-0.5", "+1e-05", "-1.2e-05", "-3", "-inf", "nan", "-.5", "0.25", "-7.", "12"]


@pytest.mark.parametrize("cell", FORMULAS)
def test_a_cell_a_spreadsheet_would_execute_is_written_as_text(cell: str):
    assert cell.startswith(FORMULA_STARTS)
    assert spreadsheet_cell(cell) == "'" + cell


@pytest.mark.parametrize("cell", [*NUMBERS, "", "block_01", "cls", "holds", "a=b", "1-2", 3, -0.5, None])
def test_numbers_and_ordinary_text_are_unchanged(cell):
    assert spreadsheet_cell(cell) == cell
    if isinstance(cell, str) and cell in NUMBERS:
        float(cell)  # what a program reading the CSV parses


def test_the_report_writes_point_names_escaped_and_numbers_as_numbers(tmp_path: Path):
    """Before: a point named ``=1+1`` went raw into findings.csv. `write_csv` writes both findings.csv and
    hypotheses.csv."""
    from tgo.report import build

    assert build.write_csv is write_csv
    rows = [
        {"point": "=1+1", "change": "-0.5", "note": "-see docs"},
        {"point": "block_01", "change": "-inf", "note": ""},
    ]
    path = tmp_path / "cells.csv"
    write_csv(path, ["point", "change", "note"], rows)
    with open(path, encoding="utf-8", newline="") as fh:
        read = list(csv.DictReader(fh))
    assert read == [
        {"point": "'=1+1", "change": "-0.5", "note": "'-see docs"},
        {"point": "block_01", "change": "-inf", "note": ""},
    ]


def test_the_csv_is_utf8_whatever_the_locale(tmp_path: Path):
    """Under a locale that is not UTF-8 (here C, with Python's coercion and UTF-8 mode off) open()'s default encoding
    is ASCII: the findings' "±" and "−" stopped tgo-report with a UnicodeEncodeError until the writer named UTF-8."""
    path = tmp_path / "findings.csv"
    child = (  # ASCII source (that locale cannot decode more): the cells spelled with escapes
        "import locale, sys; from pathlib import Path; from tgo.report.spreadsheet import write_csv\n"
        "encoding = locale.getpreferredencoding(False)\n"
        "assert encoding.lower() not in ('utf-8', 'utf8'), encoding\n"
        "write_csv(Path(sys.argv[1]), ['change', 'note'], [{'change': '0.14 \\u00b1 0.0004', 'note': '\\u22123'}])\n"
    )
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    command = [sys.executable, "-c", child, str(path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert path.read_text(encoding="utf-8") == "change,note\n0.14 \u00b1 0.0004,\u22123\n"
