"""CSV files for people: cells a spreadsheet would execute are written as text (OWASP's CSV-injection rule).

A cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is read by a spreadsheet as a formula, and
point names and notes come from records any file could hold: such a cell gets a leading ``'`` (shown as text), while
numbers as ``repr(float)`` writes them stay numbers."""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["FORMULA_STARTS", "spreadsheet_cell", "write_csv"]

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet read a cell as a formula

_NUMBER = re.compile(r"^[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity|nan)$", re.IGNORECASE)


def spreadsheet_cell(value: Any) -> Any:
    """``value`` as a cell no spreadsheet executes: text starting with one of `FORMULA_STARTS` gets a leading ``'``
    unless it is a plain number; anything else (numbers, empty cells, other text) is returned unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _NUMBER.match(value):
        return "'" + value
    return value


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    """Writes ``rows`` under the header ``columns`` with every cell through `spreadsheet_cell`."""
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        writer.writerows({key: spreadsheet_cell(value) for key, value in row.items()} for row in rows)
