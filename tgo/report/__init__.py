"""``tgo.report``: figures and findings of one or more runs (or of the published TGO-I data) as an offline HTML page.

Usage::

    python -m tgo.report RUN_DIR [RUN_DIR ...] [--out DIR] [--reference none|tgo1] [--title TEXT]
                         [--window 0.1] [--min-window 2] [--z 3] [--stable-tolerance 0.1]
    python -m tgo.report --published --out DIR

Modules, one job each: `runs` (find and read runs), `context` (every view read once, aggregated once, both tables
judged once: what every section and the live story read), `verdicts` (window means and the uncertainty of their
differences), `findings` (the paper's claims as pure functions, and `evaluate`: one table of statements judged),
`hypotheses` (TGO-I's three explanations of spreading variance as predictions, judged by the same evaluation),
`statements` (what the two tables share: the false-discovery control, the agreement count, the CSV rows), `cells`
(every number written), `aggregate` (several runs: mean, spread), `reference` (the published TGO-I data), the
sections (`story`, `hypotheses_section`, `phases`, `optimisation`, `sections`; each ``section(ctx) ->
list[Section]``), `summary` (the verdict counts),
`figures` (PNGs via `tgo.viz`), `html` (the page, from a jinja2 template), `build` (the loop over the sections). The
verdict rule is documented in ``docs/findings.md``, the hypotheses in ``docs/hypotheses.md``.
"""

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
