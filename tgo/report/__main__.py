"""``python -m tgo.report``: the command line of `tgo.report.build_report`.

Bad input (not a run, no records, differing analysis subsets) prints ``tgo.report: error: <message>`` and exits
with status 2, without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tgo.errors import UserInputError
from tgo.records import RunDir
from tgo.report.build import REFERENCE_MODES, build_report
from tgo.report.findings import DEFAULT_STABLE_TOLERANCE, DEFAULT_TOLERANCE


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The report's arguments (see ``python -m tgo.report --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m tgo.report",
        description="Figures and findings of TGO runs as an offline HTML page (report/index.html).",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="a run directory, or a directory containing runs (e.g. a Hydra multirun sweep)",
    )
    parser.add_argument("--out", default=None, help=f"report directory (default: <first RUN_DIR>/{RunDir.REPORT})")
    parser.add_argument(
        "--reference",
        choices=REFERENCE_MODES,
        default="auto",
        help="overlay the published TGO-I measurements: auto = when the points are the paper's 15 "
        "(default), paper = always, none = never",
    )
    parser.add_argument("--title", default=None, help="page title")
    parser.add_argument(
        "--allow-different-subsets",
        action="store_true",
        help="compare runs whose analysis subsets differ (refused by default)",
    )
    parser.add_argument("--embed", action="store_true", help="inline the PNG figures in index.html")
    parser.add_argument("--no-correlation", action="store_true", help="skip correlation heatmaps (faster)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"relative change counted as noise in verdicts (default {DEFAULT_TOLERANCE})",
    )
    parser.add_argument(
        "--stable-tolerance",
        type=float,
        default=DEFAULT_STABLE_TOLERANCE,
        help=f"largest relative change of a stable embedding (default {DEFAULT_STABLE_TOLERANCE})",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Builds the report; returns the exit status (0 ok, 2 bad input)."""
    args = parse_args(argv)
    try:
        index = build_report(
            args.runs,
            out=args.out,
            reference=args.reference,
            title=args.title,
            allow_different_subsets=args.allow_different_subsets,
            embed=args.embed,
            tolerance=args.tolerance,
            stable_tolerance=args.stable_tolerance,
            correlation=not args.no_correlation,
        )
    except UserInputError as error:
        print(f"tgo.report: error: {error}", file=sys.stderr)
        return 2
    print(f"[tgo] report: {index.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
