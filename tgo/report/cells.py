"""How the report writes a number: every table cell of the page and every CSV cell, in one place.

The page shows rounded numbers; the CSVs hold exact ``repr`` strings, so a program reading them gets the recorded values
back. What an absent value reads is each caller's choice (``""`` in a table, ``"n/a"`` in a sentence)."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["agreement", "csv_number", "number", "percent", "plus_minus", "q_value", "z_value"]


def number(value: float | int | None, digits: int = 4, nan: str = "") -> str:
    """``value`` to ``digits`` significant digits; an int as it is; ``nan`` for NaN, ``""`` for None."""
    if value is None:
        return ""
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return nan if math.isnan(value) else str(value)
    return f"{value:.{digits}g}"


def plus_minus(value: float, total: float, *, digits: int = 4, signed: bool = True, missing: str | None = "") -> str:
    """``+1.234 ± 0.045``; a table cell (``missing`` a string) reads ``missing`` for a non-finite value and leaves an
    unknown error out, a note's prose (``missing=None``) writes both as they are."""
    if missing is not None and not math.isfinite(value):
        return missing
    text = f"{value:+.{digits}g}" if signed else f"{value:.{digits}g}"
    return text + (f" ± {total:.2g}" if missing is None or math.isfinite(total) else "")


def percent(value: float) -> str:
    """``+12.3%`` (a relative change); ``""`` when not finite."""
    return f"{value:+.1%}" if math.isfinite(value) else ""


def z_value(z: float) -> str:
    """``+7.8``; ``""`` for NaN (an infinite z is written)."""
    return "" if math.isnan(z) else f"{z:+.1f}"


def q_value(q: float) -> str:
    """A q-value to 2 significant digits; ``""`` when not finite."""
    return f"{q:.2g}" if math.isfinite(q) else ""


def csv_number(value: float | None, nan: str = "") -> str:
    """A CSV cell: the exact ``repr`` of the value as a float (infinities too), ``nan`` for NaN, ``""`` for None."""
    if value is None:
        return ""
    return nan if math.isnan(value) else repr(float(value))


def agreement(counter: Mapping[str, int], n_runs: int) -> str:
    """``holds 2/3, does not hold 1/3``: how many runs reached each verdict, in the counter's order (verdicts no run
    reached left out)."""
    return ", ".join(f"{verdict} {count}/{n_runs}" for verdict, count in counter.items() if count)
