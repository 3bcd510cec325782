"""``python -m tgo.report``: the command line of `tgo.report.build_report`.

Bad input prints ``tgo.report: error: <message>`` and exits with status 2, without a traceback; anything else is a bug
and keeps its traceback. SIGTERM ends a report with status 143, the old report left whole (`tgo.report.output`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tgo.errors import Stopped, UserInputError, stopped_by_sigterm
from tgo.records import RunDir
from tgo.report.build import REFERENCE_MODES, build_published_report, build_report
from tgo.report.verdicts import (
    DEFAULT_FDR,
    DEFAULT_MIN_WINDOW,
    DEFAULT_STABLE_TOLERANCE,
    DEFAULT_WINDOW,
    DEFAULT_Z,
    VerdictSettings,
)

_TOLERANCE_REMOVED = (
    "--tolerance was removed: verdicts no longer compare single epochs against a fixed tolerance but window means "
    "against their uncertainty; set the windows with --window/--min-window and the threshold with --z"
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The report's arguments (see ``python -m tgo.report --help``)."""
    parser = argparse.ArgumentParser(
        prog=None if Path(sys.argv[0]).name.startswith("tgo-") else "python -m tgo.report",  # console script: its name
        description="Figures and findings of TGO runs as an offline HTML page (report/index.html).",
    )
    parser.add_argument(
        "runs",
        nargs="*",
        metavar="RUN_DIR",
        help="a run directory, or a directory containing runs (e.g. a Hydra multirun sweep)",
    )
    parser.add_argument(
        "--published",
        action="store_true",
        help="report the shipped published TGO-I measurements alone (no RUN_DIR; needs --out)",
    )
    parser.add_argument("--out", default=None, help=f"report directory (default: <first RUN_DIR>/{RunDir.REPORT})")
    parser.add_argument(
        "--reference",
        choices=REFERENCE_MODES,
        default="none",
        help="tgo1 = add the published TGO-I measurements (ViT-S/16, ImageNet-100) beside the runs' curves, a "
        "comparison table and their verdicts; none = the runs alone (default)",
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
        "-q", "--quiet", action="store_true", help="no progress lines on stderr (errors and the page's path remain)"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW,
        help=f"verdict windows as a fraction of the observed epochs (default {DEFAULT_WINDOW})",
    )
    parser.add_argument(
        "--min-window",
        type=int,
        default=DEFAULT_MIN_WINDOW,
        help=f"fewest observations in a verdict window (default {DEFAULT_MIN_WINDOW})",
    )
    parser.add_argument(
        "--z",
        type=float,
        default=DEFAULT_Z,
        help=f"standard errors a contrast must exceed to count, Student-t widened (default {DEFAULT_Z:g})",
    )
    parser.add_argument(
        "--fdr",
        type=float,
        default=DEFAULT_FDR,
        help=f"false-discovery rate controlled over each table's rows, Benjamini-Hochberg (default {DEFAULT_FDR:g})",
    )
    parser.add_argument(
        "--stable-tolerance",
        type=float,
        default=DEFAULT_STABLE_TOLERANCE,
        help=f"largest relative change of a stable embedding (default {DEFAULT_STABLE_TOLERANCE})",
    )
    parser.add_argument("--tolerance", type=float, default=None, help=argparse.SUPPRESS)  # removed: says why
    return parser.parse_args(argv)


def _settings(args: argparse.Namespace) -> VerdictSettings:
    """The verdict settings of the command line (``--tolerance`` was removed and is refused)."""
    if args.tolerance is not None:
        raise UserInputError(_TOLERANCE_REMOVED)
    try:
        return VerdictSettings(args.window, args.min_window, args.z, args.stable_tolerance, args.fdr)
    except ValueError as err:
        raise UserInputError(f"verdict settings: {err}") from err


def _say(line: str) -> None:
    """One progress line on stderr, at once (a report can take minutes: each section says when it is done)."""
    print(f"[tgo] report: {line}", file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, summary: list[str]) -> Path:
    settings = _settings(args)
    progress = None if args.quiet else _say
    if args.published:
        if args.runs:
            raise UserInputError(
                "--published reports the published data alone; to compare runs with it use RUN_DIR --reference tgo1"
            )
        if args.out is None:
            raise UserInputError("--published needs --out DIR (there is no run directory to write into)")
        return build_published_report(
            args.out, settings=settings, title=args.title, embed=args.embed, progress=progress
        )
    if not args.runs:
        raise UserInputError("give at least one RUN_DIR, or --published --out DIR for the published TGO-I data")
    return build_report(
        args.runs,
        out=args.out,
        reference=args.reference,
        title=args.title,
        allow_different_subsets=args.allow_different_subsets,
        embed=args.embed,
        settings=settings,
        correlation=not args.no_correlation,
        messages=summary,
        progress=progress,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Builds the report; returns the exit status (0 ok, 2 bad input, ``128 + signum`` when stopped by SIGTERM)."""
    args = parse_args(argv)
    summary: list[str] = []
    try:
        with stopped_by_sigterm():
            index = _run(args, summary)
    except UserInputError as error:
        print(f"tgo.report: error: {error}", file=sys.stderr)
        return 2
    except Stopped as stop:
        print(
            f"tgo.report: stopped by {stop.name}: the output directory holds a whole report "
            "(the previous one, or none, unless the new one was already complete); nothing half-written is left",
            file=sys.stderr,
        )
        return 128 + stop.signum
    print(f"[tgo] report: {index.resolve()}")
    for line in summary:
        print(f"[tgo] {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
