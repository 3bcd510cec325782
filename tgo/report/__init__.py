"""``tgo.report``: figures and findings of one or more runs (or of the published TGO-I data) as an offline HTML page.

Usage::

    python -m tgo.report RUN_DIR [RUN_DIR ...] [--out DIR] [--reference none|tgo1] [--title TEXT]
                         [--window 0.1] [--min-window 2] [--z 3] [--stable-tolerance 0.1]
    python -m tgo.report --published --out DIR

Each module's job is in docs/architecture.md; the verdict rule in ``docs/findings.md``, the hypotheses in
``docs/hypotheses.md``."""

from tgo.report.aggregate import SubsetMismatchError
from tgo.report.build import build_published_report, build_report
from tgo.report.findings import CLAIMS, VERDICTS, Finding, Trend, assess_trend, evaluate_findings
from tgo.report.hypotheses import HYPOTHESES, PREDICTIONS, Prediction, evaluate_predictions
from tgo.report.runs import ReportInputError
from tgo.report.verdicts import VerdictSettings

__all__ = [
    "CLAIMS",
    "HYPOTHESES",
    "PREDICTIONS",
    "VERDICTS",
    "Finding",
    "Prediction",
    "ReportInputError",
    "SubsetMismatchError",
    "Trend",
    "VerdictSettings",
    "assess_trend",
    "build_published_report",
    "build_report",
    "evaluate_findings",
    "evaluate_predictions",
]
