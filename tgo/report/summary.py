"""The report's verdict summary: counts per claim and per prediction, and the worst contradictions by name.

A reader who stops after the story figure should still know what the tables found: how many points agree with each
of the paper's claims and each hypothesis's predictions, and where the records contradict them most strongly (the
contradictions ranked by |z|, the strength of the evidence against the claim). Everything here counts verdicts the
findings and the Hypotheses section already reached; nothing is judged again.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tgo.report.findings import FAILS, REVERSES, VERDICTS, Finding
from tgo.report.html import Section, Table
from tgo.report.hypotheses import HYPOTHESES, INCONSISTENT, PREDICTION_VERDICTS, Prediction, PredictionResult

__all__ = ["WORST_SHOWN", "Contradiction", "contradictions", "verdict_summary_section"]

WORST_SHOWN = 8
"""How many contradictions the summary names (the rest are in the full tables, counted)."""


@dataclass(frozen=True)
class Contradiction:
    """One row whose verdict goes against its claim or prediction.

    Attributes:
        what: The claim or prediction in words.
        source: ``finding`` (the paper's claims) or ``prediction`` (a hypothesis's, named).
        point: Where.
        verdict: ``does not hold``, ``holds then reverses`` or ``inconsistent``.
        z: The evidence's signed z (of the change; of the margin for the CLS claims).
        change: The move it is about, as the table writes it (``-1.2 ± 0.3``).
    """

    what: str
    source: str
    point: str
    verdict: str
    z: float
    change: str


def _change(value: float, total: float) -> str:
    if not math.isfinite(value):
        return ""
    return f"{value:+.4g}" + (f" ± {total:.2g}" if math.isfinite(total) else "")


def contradictions(
    findings: Sequence[Finding], predictions: Mapping[Prediction, Sequence[PredictionResult]]
) -> list[Contradiction]:
    """Every contradicted row, strongest evidence first (|z| descending; a reversal counts by its drop's z)."""
    rows: list[Contradiction] = []
    for f in findings:
        if f.verdict not in (FAILS, REVERSES):
            continue
        if f.extreme is not None:
            z, change = f.extreme.z, _change(f.extreme.margin, f.extreme.uncertainty.total)
        elif f.trend is not None and f.verdict == REVERSES:
            t = f.trend
            z, change = (
                t.drop_uncertainty.z(t.drop),
                f"peak {t.peak_window}, then {_change(-t.drop, t.drop_uncertainty.total)}",
            )
        elif f.trend is not None:
            z, change = f.trend.z, _change(f.trend.change, f.trend.uncertainty.total)
        else:
            continue
        rows.append(Contradiction(f.statement, "finding", f.point, f.verdict, z, change))
    for prediction, results in predictions.items():
        for r in results:
            if r.verdict == INCONSISTENT:
                what = f"{HYPOTHESES[prediction.hypothesis].title}: {prediction.statement}"
                change = _change(r.trend.change, r.trend.uncertainty.total)
                rows.append(Contradiction(what, "prediction", r.point, r.verdict, r.trend.z, change))
    return sorted(rows, key=lambda c: -abs(c.z) if math.isfinite(c.z) else -math.inf)


def _claim_counts(findings: Sequence[Finding]) -> Table:
    per_statement: dict[str, Counter] = {}
    for f in findings:
        per_statement.setdefault(f.statement, Counter())[f.verdict] += 1
    rows = [
        [statement, *(str(c.get(v, 0)) for v in VERDICTS), str(sum(c.values()))]
        for statement, c in per_statement.items()
    ]
    return Table(["the paper's claim", *VERDICTS, "points"], rows, left=[0])


def _prediction_counts(predictions: Mapping[Prediction, Sequence[PredictionResult]]) -> Table:
    rows = []
    for prediction, results in predictions.items():
        counts = Counter(r.verdict for r in results)
        cells = [str(counts.get(v, 0)) if results else "" for v in PREDICTION_VERDICTS]
        rows.append(
            [HYPOTHESES[prediction.hypothesis].title, prediction.statement, *cells, str(len(results)) or "not recorded"]
        )
    return Table(["hypothesis", "prediction", *PREDICTION_VERDICTS, "points"], rows, left=[0, 1])


def verdict_summary_section(
    findings: Sequence[Finding], predictions: Mapping[Prediction, Sequence[PredictionResult]]
) -> Section:
    """The summary section: the worst contradictions named, then the verdict counts per claim and per prediction."""
    section = Section("Verdicts at a glance", "summary")
    worst = contradictions(findings, predictions)
    if worst:
        shown = worst[:WORST_SHOWN]
        more = len(worst) - len(shown)
        section.paragraphs.append(
            f"{len(worst)} row(s) of the tables below contradict their claim or prediction; the strongest "
            f"{len(shown)} by |z| (the evidence against it, in standard errors):"
            + (f" {more} more are in the full tables." if more else "")
        )
        section.tables.append(
            Table(
                ["claim or prediction", "point", "verdict", "change ± standard error", "z"],
                [[c.what, c.point, c.verdict, c.change, f"{c.z:+.1f}" if math.isfinite(c.z) else ""] for c in shown],
                left=[0, 1, 2],
                verdict_column=2,
            )
        )
    else:
        section.paragraphs.append("No row of the tables below contradicts its claim or prediction.")
    if findings:
        section.tables.append(_claim_counts(findings))
    if any(predictions.values()):
        section.tables.append(_prediction_counts(predictions))
    return section
