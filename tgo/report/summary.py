"""The report's verdict summary: counts per claim and per prediction, and the worst contradictions by name.

A reader who stops after the story figure should still know what the tables found. Everything here counts verdicts
already reached; nothing is judged again."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tgo.report.cells import plus_minus
from tgo.report.findings import FAILS, REVERSES, VERDICTS, Finding
from tgo.report.html import Section, Table
from tgo.report.hypotheses import HYPOTHESES, INCONSISTENT, PREDICTION_VERDICTS, Prediction, PredictionResult
from tgo.report.verdicts import Uncertainty

__all__ = [
    "WORST_SHOWN",
    "Contradiction",
    "contradictions",
    "learning_sentence",
    "verdict_counts_line",
    "verdict_scope_sentence",
    "verdict_summary_section",
]

WORST_SHOWN = 8
"""How many contradictions the summary names (the rest are in the full tables, counted)."""


@dataclass(frozen=True)
class Contradiction:
    """One row whose verdict goes against its claim or prediction, with its signed z and the change as written."""

    what: str
    source: str
    point: str
    verdict: str
    z: float
    change: str


def contradictions(
    findings: Sequence[Finding], predictions: Mapping[Prediction, Sequence[PredictionResult]]
) -> list[Contradiction]:
    """Every contradicted row, strongest evidence first (|z| descending; a reversal counts by its drop's z)."""
    rows: list[Contradiction] = []
    for f in findings:
        if f.verdict not in (FAILS, REVERSES):
            continue
        if f.extreme is not None:
            z, change = f.extreme.z, plus_minus(f.extreme.margin, f.extreme.uncertainty.total)
        elif f.trend is not None and f.verdict == REVERSES:
            t = f.trend
            z, change = (
                t.drop_uncertainty.z(t.drop),
                f"peak {t.peak_window}, then {plus_minus(-t.drop, t.drop_uncertainty.total)}",
            )
        elif f.trend is not None:
            z, change = f.trend.z, plus_minus(f.trend.change, f.trend.uncertainty.total)
        else:
            continue
        rows.append(Contradiction(f.statement, "finding", f.point, f.verdict, z, change))
    for prediction, results in predictions.items():
        for r in results:
            if r.verdict == INCONSISTENT:
                what = f"{HYPOTHESES[prediction.hypothesis].title}: {prediction.statement}"
                change = plus_minus(r.trend.change, r.trend.uncertainty.total)
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


def _counted(counts: Counter, order: Sequence[str]) -> str:
    return ", ".join(f"{counts[v]} {v}" for v in order if counts.get(v))


def verdict_counts_line(
    findings: Sequence[Finding], predictions: Mapping[Prediction, Sequence[PredictionResult]]
) -> str:
    """``Verdicts: the paper's claims 128 holds, 7 does not hold, ...; the hypotheses' predictions 210 consistent,
    ...`` (the first screen's counts; the tables are under Verdicts at a glance)."""
    parts = []
    if findings:
        parts.append(f"the paper's claims {_counted(Counter(f.verdict for f in findings), VERDICTS)}")
    rows = [r for results in predictions.values() for r in results]
    if rows:
        parts.append(f"the hypotheses' predictions {_counted(Counter(r.verdict for r in rows), PREDICTION_VERDICTS)}")
    return "Verdicts: " + "; ".join(parts) + "." if parts else ""


def _uncertainty_of(row: Finding | PredictionResult) -> Uncertainty | None:
    if isinstance(row, Finding) and row.extreme is not None:
        return row.extreme.uncertainty
    return row.trend.uncertainty if row.trend is not None else None


CHANCE_FACTOR = 1.5
"""A final top-1 at most this many times chance (``1 / classes``) reads as a run that did not learn."""


def learning_sentence(names: Sequence[str], infos: Sequence[Any]) -> str:
    """One sentence for the first screen when a run ended near chance accuracy (issue 37): its geometry is that of a
    network that did not learn, so its verdicts say nothing of what training does; ``""`` otherwise or unknown."""
    flat = [
        (name, info.top1, 1.0 / info.classes)
        for name, info in zip(names, infos, strict=True)
        if info.top1 is not None and info.classes and info.top1 <= CHANCE_FACTOR / info.classes
    ]
    if not flat:
        return ""
    which = ", ".join(f"{name} ({top1:.1%} against {chance:.1%})" for name, top1, chance in flat)
    return (
        f"Did not learn: the final validation top-1 of {which} is within {CHANCE_FACTOR:g} times chance "
        "(1 / classes); its geometry is that of a network that has not learned the task, and its verdicts say "
        "nothing of what training does."
    )


def verdict_scope_sentence(
    findings: Sequence[Finding], predictions: Mapping[Prediction, Sequence[PredictionResult]], n_runs: int
) -> str:
    """What the verdicts can and cannot conclude, in one sentence (issue 34): beyond image sampling everywhere, beyond
    training noise only where it could be estimated; another seed is the one thing a run cannot see."""
    rows: list[Finding | PredictionResult] = [*findings, *(r for results in predictions.values() for r in results)]
    judged = [
        u for row in rows if row.verdict != "n/a" and (u := _uncertainty_of(row)) is not None and math.isfinite(u.total)
    ]
    with_training = sum(1 for u in judged if u.training_estimated)
    if n_runs > 1:
        return (
            f"These verdicts are on the mean of {n_runs} runs, beyond image sampling (the jackknife) and the "
            "seed-to-seed spread of training, so they say what this setup does across seeds, not only what one run "
            "did."
        )
    return (
        f"One run can conclude what it did on these images beyond image sampling (the jackknife), and beyond its "
        f"own epoch-to-epoch training noise for the {with_training} of {len(judged)} judged rows where that noise "
        "could be estimated from the run, but not what another seed would do: the other rows are statements about "
        "this run, a dip after a peak counts as a reversal only beyond training noise, and a seed sweep measures "
        "the rest."
    )
