"""A table of judged statements: the paper's claims and the hypotheses' predictions are two tables of the same kind of
row (``key``, ``verdict``, ``note``, ``trend``, ``p``, ``q``, ``csv_cells(z)``), which go through the same three steps
here: the false-discovery control, the agreement count over runs and the CSV rows."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar, Union

from tgo.report.cells import agreement as agreement_text
from tgo.report.cells import csv_number
from tgo.report.verdicts import Uncertainty, VerdictSettings, control_fdr

if TYPE_CHECKING:
    from tgo.report.findings import Finding, Trend
    from tgo.report.hypotheses import PredictionResult

__all__ = [
    "JUDGED_COLUMNS",
    "Statement",
    "control_fdr_table",
    "count_agreement",
    "csv_rows",
    "judged_cells",
    "uncertainty_cells",
    "window_band",
]

JUDGED_COLUMNS: tuple[str, ...] = (
    "verdict",
    "first",
    "last",
    "change",
    "relative_change",
    "scale",
    "jackknife_se",
    "jackknife_paired",
    "training_se",
    "training_source",
    "training_dof",
    "uncertainty",
    "uncertainty_source",
    "dof",
    "threshold",
    "z",
    "p",
    "q",
    "window",
)
"""The columns of a judged trend, with the same meaning in ``findings.csv`` and ``hypotheses.csv``
(``docs/findings.md``)."""


Statement = Union["Finding", "PredictionResult"]
"""A row of either table: its ``key``, ``verdict``, ``note``, ``trend``, ``p``, ``q`` and ``csv_cells(z)``."""
Row = TypeVar("Row", "Finding", "PredictionResult")


def control_fdr_table(
    rows: Sequence[Row], settings: VerdictSettings, directional: Iterable[str], fallback: str
) -> list[Row]:
    """The rows with their Benjamini-Hochberg q-values over the table (rows without a p-value do not count); a
    ``directional`` verdict whose ``q > settings.fdr`` reads ``fallback``, its note saying why."""
    directional = tuple(directional)
    out = []
    for row, q in zip(rows, control_fdr([r.p for r in rows]), strict=True):
        q = float(q)
        trend = replace(row.trend, q=q) if row.trend is not None else None
        changes: dict[str, Any] = {"q": q, "trend": trend}
        if row.verdict in directional and not q <= settings.fdr:
            note = "; ".join(
                p
                for p in (row.note, f"q = {q:.2g} > {settings.fdr:g}: not a discovery after false-discovery control")
                if p
            )
            changes.update(verdict=fallback, note=note, trend=replace(trend, note=note) if trend is not None else None)
        out.append(replace(row, **changes))
    return out


def count_agreement(per_run: Iterable[Iterable[Statement]], verdicts: Sequence[str]) -> dict[Hashable, Counter]:
    """How many runs reached each verdict, per row key: ``{key: Counter({verdict: runs})}`` with every verdict of
    ``verdicts`` present (0 if none), in that order."""
    counts: dict[Hashable, Counter] = {}
    for rows in per_run:
        for r in rows:
            counts.setdefault(r.key, Counter(dict.fromkeys(verdicts, 0)))[r.verdict] += 1
    return counts


def uncertainty_cells(u: Uncertainty, z: float, z_threshold: float) -> dict[str, str]:
    """The uncertainty columns of `JUDGED_COLUMNS` for one contrast of signed size ``z`` (exact ``repr`` strings)."""
    return {
        "jackknife_se": csv_number(u.jackknife),
        "jackknife_paired": ("true" if u.paired else "false") if math.isfinite(u.jackknife) else "",
        "training_se": csv_number(u.training),
        "training_source": u.training_source,
        "training_dof": csv_number(u.training_dof) if u.training_estimated else "",
        "uncertainty": csv_number(u.total),
        "uncertainty_source": u.source,
        "dof": csv_number(u.dof) if math.isfinite(u.total) else "",
        "threshold": csv_number(u.threshold(z_threshold)),
        "z": csv_number(z),
    }


def judged_cells(trend: Trend, p: float, q: float, z_threshold: float) -> dict[str, str]:
    """The `JUDGED_COLUMNS` of one judged trend (numbers as exact ``repr`` strings, empty when absent)."""
    return {
        "first": csv_number(trend.first),
        "last": csv_number(trend.last),
        "change": csv_number(trend.change),
        "relative_change": csv_number(trend.relative_change),
        "scale": trend.scale,
        **uncertainty_cells(trend.uncertainty, trend.z, z_threshold),
        "p": csv_number(p),
        "q": csv_number(q),
        "window": str(trend.window),
    }


def csv_rows(
    rows: Iterable[Statement],
    columns: Sequence[str],
    z: float,
    agreement: dict[Hashable, Counter] | None = None,
    n_runs: int = 1,
) -> list[dict[str, str]]:
    """A table's CSV rows: every column of ``columns`` (empty when the row has no value), the row's own cells, and
    with ``agreement`` the runs reaching each verdict."""
    out = []
    for r in rows:
        row = {**dict.fromkeys(columns, ""), **r.csv_cells(z)}
        if agreement:
            row["agreement"] = agreement_text(agreement[r.key], n_runs)
        out.append(row)
    return out


def window_band(level: float, uncertainty: Uncertainty, scale: str) -> tuple[float, float]:
    """The ±1 paired standard-error band of a window mean (``exp(log level ± J)`` on a log scale; NaN where unknown)."""
    se = uncertainty.jackknife
    if not (math.isfinite(se) and math.isfinite(level)) or (scale == "log" and level <= 0):
        return math.nan, math.nan
    if scale == "log":
        return level * math.exp(-se), level * math.exp(se)
    return level - se, level + se
