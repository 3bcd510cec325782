"""The one table of the benchmarks: the row registry (`ROWS`), the `Table` rows are written to, and `render_columns`,
the one renderer of aligned columns (the benchmark table, the spectral engine's, the GPU acceptance check's, the
soak's and seed replication's).

A benchmark module writes its rows into a `Table` (``table.add`` / ``table.skip``); every row it may write is
declared here, once, with the ``--skip`` sections it needs, so ``python -m benchmarks`` can tell a complete table
from a rotted one and ``tests/benchmarks/test_smoke.py`` can check ``results.json`` against the same list. Run alone
(``python -m benchmarks.scale_bench``), a module gets the same table through `run_alone`.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Container, Iterable, Sequence
from pathlib import Path
from typing import Any

SECTIONS: tuple[str, ...] = (
    "spectral",
    "vit_small",
    "quickstart",
    "memory",
    "training",
    "callback_cost",
    "figures",
    "gpu",
    "jackknife",
    "probes",
    "attention",
    "summary",
    "scale",
    "optimisation",
    "curvature",
    "families",
    "peer",
    "widths",
)
"""What ``python -m benchmarks --skip`` can leave out, in run order."""


def _numbered(prefix: str, count: int, start: int = 1) -> tuple[str, ...]:
    return tuple(f"{prefix}.{i}" for i in range(start, start + count))


OVERHEAD_ROWS = 6
"""Rows `observation_bench.overhead` writes under its prefix: forward, two ratios, hooks only, two phase splits."""
GPU_ROWS: tuple[str, ...] = ("6.0", *_numbered("6.1", OVERHEAD_ROWS, 0), "6.2", "6.3", "6.4")
CALLBACK_COST_ROWS = _numbered("17", 8)
"""Rows `callback_cost_bench` writes: the callback's cost per logger against the same fit without it."""
SUMMARY_ROWS = _numbered("10", 2)
SCALE_ROWS = _numbered("11", 8)
OPTIMISATION_ROWS = _numbered("12", 3)
CURVATURE_ROWS = _numbered("13", 5)
PEER_ROWS = (*_numbered("16", 8), "16.10")
"""Rows `peer_bench` writes on the CPU (16.9, the same on a GPU, also needs the ``gpu`` section)."""
WIDTH_ROWS = _numbered("15", 7)


@functools.cache
def _registry() -> dict[str, Any]:
    """``OFF_BY_DEFAULT`` (the registered measurement families an observation leaves off by default: rows 14,
    `families_bench`, cost each), ``FAMILY_ROWS`` and ``ROWS``, built at first use: reading the family registry imports
    the library, which `spectral_bench` (``render_columns`` alone) need not."""
    from tgo.observatory import ObservationSettings
    from tgo.observatory.families import registered_families

    settings = ObservationSettings()
    off = tuple(f.name for f in registered_families() if not f.enabled(settings))
    family_rows = tuple(f"14.{name}.{what}" for name in off for what in ("stream", "payload", "summary"))
    rows = _STATIC_ROWS | {row: ("vit_small", "families") for row in family_rows}
    rows |= {row: ("callback_cost",) for row in CALLBACK_COST_ROWS}
    return {"OFF_BY_DEFAULT": off, "FAMILY_ROWS": family_rows, "ROWS": rows}


def __getattr__(name: str) -> Any:
    """The registry's names (`_registry`) as module attributes: ``from benchmarks._table import ROWS``."""
    if name in ("OFF_BY_DEFAULT", "FAMILY_ROWS", "ROWS"):
        return _registry()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_STATIC_ROWS: dict[str, tuple[str, ...]] = {
    **{row: ("vit_small",) for row in _numbered("1a", OVERHEAD_ROWS, 0)},
    **{row: ("quickstart",) for row in _numbered("1b", OVERHEAD_ROWS, 0)},
    "2.1": ("vit_small",),
    **{row: ("memory",) for row in ("2.2", "2.3", "2.4", "3.1", "3.2", "3.3")},
    **{row: ("training",) for row in _numbered("4", 3)},
    "5.1": ("vit_small",),
    "5.2": ("quickstart",),
    "5.3": ("vit_small", "figures"),
    "5.4": ("quickstart", "figures"),
    **{row: ("gpu",) for row in GPU_ROWS},
    **{row: ("vit_small" if row in ("7.1", "7.3", "7.6") else "quickstart", "jackknife") for row in _numbered("7", 4)},
    "7.5": ("memory", "jackknife"),
    "7.6": ("vit_small", "jackknife"),
    "7.7": ("quickstart", "jackknife"),
    "8.1": ("vit_small", "probes"),
    "8.2": ("quickstart", "probes"),
    **{row: ("vit_small", "probes") for row in _numbered("8", 3, 3)},
    **{row: ("vit_small", "attention") for row in _numbered("9", 3)},
    **{row: ("summary",) for row in SUMMARY_ROWS},
    **{row: ("scale",) for row in SCALE_ROWS},
    **{row: ("optimisation",) for row in OPTIMISATION_ROWS},
    **{row: ("curvature",) for row in CURVATURE_ROWS},
    **{row: ("widths",) for row in WIDTH_ROWS},
    **{row: ("peer", "gpu") if row == "16.9" else ("peer",) for row in _numbered("16", 10)},
}
"""Every row of the table but rows 14 (``ROWS`` adds them, `_registry`), in display order, with the ``--skip``
sections it needs: the single declaration of what a complete run contains (a row neither measured nor skipped with a
reason is a bug)."""


def render_columns(
    header: Sequence[str], rows: Iterable[Sequence[Any] | None], *, right: Container[int] = (), rule: bool = True
) -> str:
    """Columns padded to their widest cell (right-aligned where ``right`` holds their index), two spaces apart, a
    left-aligned last column unpadded; a rule of dashes under the header (40 longer than it) unless ``rule`` is
    false; a ``None`` row is a blank line."""
    cells = [None if r is None else [str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in [list(header), *(c for c in cells if c is not None)]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        padded = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        return "  ".join([*padded[:-1], padded[-1] if len(row) - 1 in right else row[-1]]).rstrip()

    head = line(header)
    return "\n".join(
        [head, *(["-" * (len(head) + 40)] if rule else []), *("" if c is None else line(c) for c in cells)]
    )


FORMATS = {"x": "{:.3f}x", "MB": "{:.1f} MB", "%": "{:.1f} %", "MB/img": "{:.3f} MB/img"}
"""How the table prints a measured value of each unit (seconds below: more digits under 10 s; others ``.4g``)."""


def format_value(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    return FORMATS[unit].format(value) if unit in FORMATS else f"{value:.4g} {unit}".strip()


class Table:
    """Rows of ``(row, measurement, value, detail)``; values are formatted strings, raw numbers go to the JSON.

    A measured row has a numeric ``value``; a row that could not be measured here has ``value`` ``None`` and its
    reason in ``skipped``. Every row is printed as it is written.
    """

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(
        self,
        row: str,
        measurement: str,
        value: float,
        unit: str = "",
        detail: str = "",
        *,
        text: str | None = None,
        **raw: Any,
    ) -> None:
        """Records one measured row; ``text`` replaces the formatted value where a number alone says too little."""
        shown = text or format_value(value, unit)
        self.rows.append(
            {"row": row, "measurement": measurement, "value": value, "unit": unit, "text": shown, "detail": detail}
            | raw
        )
        print(f"  [{row}] {measurement}: {shown}  {detail}", flush=True)

    def skip(
        self, rows: Sequence[str], measurement: str, reason: str, detail: str = "", shown_as: str | None = None
    ) -> None:
        """Records ``rows`` as not measured, each with ``reason``; ``shown_as`` renders them as one line."""
        text = f"skipped ({reason})"
        for row in rows:
            self.rows.append(
                {"row": row, "measurement": measurement, "value": None, "unit": "", "text": text, "detail": detail}
                | {"skipped": reason, "shown_as": shown_as}
            )
        print(f"  [{shown_as or ', '.join(rows)}] {measurement}: {text}  {detail}", flush=True)

    def skip_sections(self, skipped: set[str]) -> None:
        """Marks the declared rows that need a section left out with ``--skip`` (and were not measured)."""
        present = {r["row"] for r in self.rows}
        groups: dict[tuple[str, str], list[str]] = {}  # (section, row group) -> rows, shown as one line
        for row, needs in _registry()["ROWS"].items():
            section = next((s for s in needs if s in skipped), None)
            if row not in present and section is not None:
                groups.setdefault((section, row.split(".")[0]), []).append(row)
        for (section, _), rows in groups.items():
            shown = ", ".join(rows) if len(rows) <= 2 else f"{rows[0]}..{rows[-1]}"
            self.skip(rows, "(section left out)", f"--skip {section}", shown_as=shown)

    def problems(self) -> list[str]:
        """Declared rows missing, undeclared or written twice: any of them means the table code has rotted."""
        present, rows = [r["row"] for r in self.rows], _registry()["ROWS"]
        missing = [f"row {row} missing (neither measured nor skipped)" for row in rows if row not in present]
        extra = [f"row {row} is not declared in ROWS" for row in present if row not in rows]
        twice = [
            f"row {row} written {present.count(row)} times" for row in dict.fromkeys(present) if present.count(row) > 1
        ]
        return missing + extra + twice

    def render(self) -> str:
        """The rows written, in declared row order, a blank line between row groups, collapsed skips on one line."""
        order = {row: i for i, row in enumerate(_registry()["ROWS"])}
        lines: list[list[str] | None] = []
        seen: set[str] = set()
        last = None
        for r in sorted(self.rows, key=lambda r: order.get(r["row"], len(order))):
            label = r.get("shown_as") or r["row"]
            if label in seen:
                continue
            seen.add(label)
            group = r["row"].split(".")[0]
            if last is not None and group != last:
                lines.append(None)
            last = group
            lines.append([label, r["measurement"], r["text"], r["detail"]])
        return render_columns(("row", "measurement", "value", "detail"), lines, right={2})


LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "tgo", "callbacks")


def quiet() -> None:
    """Warnings and library logs (`LOGGERS`) off: the table is the output."""
    warnings.filterwarnings("ignore")
    for name in LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def run_alone(
    argv: Sequence[str] | None,
    module: str,
    rows: Callable[..., Any],
    quick: str,
    *,
    repeats: bool = False,
) -> int:
    """``python -m benchmarks.<module> [--quick | --smoke] [--repeats N]``: one module's rows alone, printed as the
    table: ``rows(table, mode, work=..., [repeats=...])`` with ``mode`` ``default``, ``quick`` or ``smoke`` and
    ``work`` a scratch folder removed afterwards; ``quick`` says what ``--quick`` measures; ``repeats`` offers
    ``--repeats``."""
    from benchmarks import _harness as h

    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help=quick)
    mode.add_argument("--smoke", action="store_true", help="a tiny ViT, seconds; measures nothing")
    if repeats:
        parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default: the mode's)")
    args = parser.parse_args(argv)
    quiet()
    print(h.environment_line(h.environment()), flush=True)
    table, work = Table(), Path(tempfile.mkdtemp(prefix=f"tgo_{module}_"))
    extra = {"repeats": args.repeats} if repeats else {}
    try:
        rows(table, "smoke" if args.smoke else "quick" if args.quick else "default", work=work, **extra)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{table.render()}\nload average {os.getloadavg()[0]:.2f} at end", flush=True)
    return 0
