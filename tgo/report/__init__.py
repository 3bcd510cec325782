"""``tgo.report``: figures and findings of one or more runs as an offline HTML page.

Usage::

    python -m tgo.report RUN_DIR [RUN_DIR ...] [--out DIR] [--reference auto|paper|none] [--title TEXT]

Modules, one job each: `runs` (find and read runs), `findings` (the paper's claims as pure functions),
`aggregate` (several runs: mean, spread, agreement), `reference` (the published TGO-I data), `figures` (PNGs via
`tgo.viz`), `html` (the page), `build` (the orchestrator).
"""

from tgo.report.aggregate import SubsetMismatchError
from tgo.report.build import build_report
from tgo.report.findings import CLAIMS, Finding, Trend, assess_trend, evaluate_findings
from tgo.report.runs import ReportInputError

__all__ = [
    "CLAIMS",
    "Finding",
    "ReportInputError",
    "SubsetMismatchError",
    "Trend",
    "assess_trend",
    "build_report",
    "evaluate_findings",
]
