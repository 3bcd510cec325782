"""The pin of issue 35: rebuilding the default run's and the published data's reports gives the same numbers.

`tests.report.report_numbers` stored them before the report became one pipeline: ``findings.csv`` and
``hypotheses.csv`` cell by cell, and every number of the page's visible text in reading order. A change meant to move
a number regenerates the fixture (``python -m tests.report.report_numbers``).

The fixture was written on one machine, so a number is compared the way another CPU can reproduce it, not bit for bit:
which BLAS kernels numpy's OpenBLAS picks for the CPU decides the last bits (with ``OPENBLAS_CORETYPE`` Haswell, Zen,
Sandybridge or Prescott in place of this machine's AVX-512 kernels, 256-670 of the published report's 1,938 numeric
cells differ, by at most 2.9e-14 relative: far-tail p-values, whose relative error is z^2 times their z's). A numeric
cell must agree to `CELL_RTOL`; text cells (verdicts, names) exactly; a number on the page as written, or within one
unit of its last printed digit (a value on a rounding boundary may print either way; the CSVs hold it in full), an
integer (a count, an index, an epoch) exactly.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.report.report_numbers import build_default_run, build_published, load, snapshot

CELL_RTOL = 1e-9
"""Relative agreement of a numeric CSV cell: 3e4 times the largest difference another CPU's kernels make (module
docstring), and far below any change of method (one more image in 1,000 moves a mean by 1e-3)."""


def _value(token: str) -> float:
    return float(token.replace("−", "-").rstrip("%"))


def _float(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def printed_unit(token: str) -> float:
    """One unit of the last digit ``token`` prints: ``0.1387`` 1e-4, ``+1.2e-05`` 1e-6, ``12`` 1, ``98.33%`` 0.01."""
    mantissa, _, exponent = token.replace("−", "-").rstrip("%").lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _is_integer(token: str) -> bool:
    return not any(c in token.lower() for c in ".en")


def same_printed_number(got: str, want: str) -> bool:
    """The same token, or values within one unit of the last printed digit of either (a rounding boundary); integers
    (counts, indices, epochs) exactly."""
    if got == want:
        return True
    if _is_integer(got) and _is_integer(want):
        return False
    a, b = _value(got), _value(want)
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return False
    return abs(a - b) <= max(printed_unit(got), printed_unit(want)) * (1 + 1e-9)


def same_cell(got: str, want: str) -> bool:
    """Text exactly; numbers (``nan`` and ``inf`` included) to `CELL_RTOL`."""
    if got == want:
        return True
    a, b = _float(got), _float(want)
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return False
    return math.isclose(a, b, rel_tol=CELL_RTOL, abs_tol=0.0)


def _same_numbers(got: list[str], want: list[str]) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        assert same_printed_number(g, w), f"number {i}: {g} (was {w}) after {got[i - 8 : i]}"
    assert len(got) == len(want), f"{len(got)} numbers on the page, {len(want)} before"


def _same_cells(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, rows in want.items():
        assert got[name][0] == rows[0], f"{name}: columns"
        assert len(got[name]) == len(rows), f"{name}: {len(got[name]) - 1} rows, {len(rows) - 1} before"
        for i, (g, w) in enumerate(zip(got[name][1:], rows[1:], strict=True), start=1):
            for column, a, b in zip(rows[0], g, w, strict=True):
                assert same_cell(a, b), f"{name} row {i} ({w[:4]}) column {column}: {a!r}, was {b!r}"


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


@pytest.mark.parametrize(
    ("got", "want", "same"),
    [
        ("0.02091597096734088", "0.02091597096734048", True),  # another CPU's BLAS: 1.9e-14 relative
        ("4.533279476678668e-31", "4.533279476678801e-31", True),  # a far-tail p-value: 2.9e-14
        ("0.0209159", "0.0209160", False),  # 5e-6 relative: a changed number
        ("10.536232241176952", "10.536232451176952", False),  # 2e-8 relative: beyond CELL_RTOL
        ("holds", "does not hold", False),
        ("nan", "nan", True),
        ("nan", "0.5", False),
        ("inf", "1e308", False),
        ("block_03", "block_3", False),
    ],
)
def test_a_csv_cell_is_the_same_number_to_1e_9_and_the_same_text_exactly(got: str, want: str, same: bool):
    assert same_cell(got, want) is same


@pytest.mark.parametrize(
    ("got", "want", "same"),
    [
        ("0.1387", "0.1387", True),
        ("0.1388", "0.1387", True),  # a value on the rounding boundary, printed the other way
        ("0.1389", "0.1387", False),
        ("+1.2e-05", "+1.3e-05", True),
        ("+1.2e-05", "+1.4e-05", False),
        ("10", "9.99", True),  # 9.995 printed with three significant digits either side of the boundary
        ("98.33%", "98.34%", True),
        ("98.33%", "98.35%", False),
        ("12", "13", False),  # counts, indices and epochs exactly
        ("15/15", "15/15", True),
        ("−0.5", "-0.5", True),
        ("nan", "0", False),
    ],
)
def test_a_number_on_the_page_is_the_same_token_or_one_printed_unit_away(got: str, want: str, same: bool):
    assert same_printed_number(got, want) is same
