"""The story figure: TGO-I's question answered in one picture, drawn from the records, each panel marked with its
verdict.

Effective rank against depth (where training spreads the variance), the variance between and within images against epoch
at the deepest block, then one panel per `STORY_PANELS` prediction. Those panels draw exactly the first and last window
means the Hypotheses tables judge, from the verdict's own `tgo.report.findings.Trend`, so figure and table can never
disagree. The same panels are the report's first figure (`story_figure`) and TensorBoard's first cards (`story_cards`,
one 480 x 240 px panel each). Nothing here decides a verdict: the marks are those it is given."""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tgo.report.aggregate import Aggregate
from tgo.report.context import SPLIT_VIEWS, Context, judge
from tgo.report.figures import FigureRef, save_figure
from tgo.report.findings import FAILS, HOLDS, INCONCLUSIVE, NA, REVERSES, Finding, Trend
from tgo.report.html import Section
from tgo.report.hypotheses import CONSISTENT, INCONSISTENT, PredictionResult
from tgo.report.hypothesis_figures import VERDICT_COLOURS
from tgo.report.runs import load_run_data
from tgo.report.statements import window_band
from tgo.spectral.catalogue import CATALOGUE
from tgo.viz import CLS_STYLE, FIRST_COLOUR, LAST_COLOUR, epoch_colourbar, epoch_colours, log_axis

__all__ = [
    "STORY_PANELS",
    "Mark",
    "Panel",
    "Story",
    "build_story",
    "run_story",
    "run_story_cards",
    "story_caption",
    "story_cards",
    "story_figure",
]

STORY_PANELS: tuple[tuple[str, str, str], ...] = (
    ("ncc_accuracy", "cls", "CLS nearest-class-centre accuracy"),
    ("fisher_ratio", "cls", "CLS Fisher ratio (between / within class)"),
    ("mean_abs_offdiag_correlation", "all", "mean |correlation| between features"),
    ("attention_entropy", "attention", "attention entropy of the patch queries (nats)"),
)
"""The against-depth panels after the first two: (metric, view, title), each a Hypotheses prediction's."""
CLS_COLOUR = CLS_STYLE["color"]
VARIANCE_COLOURS = {"between_image": "#c2410c", "within_image": "#1d4ed8"}
_FINDING_COLOURS = {
    HOLDS: VERDICT_COLOURS["consistent"],
    REVERSES: "#d98c1f",
    INCONCLUSIVE: VERDICT_COLOURS["inconclusive"],
    FAILS: VERDICT_COLOURS["inconsistent"],
    NA: VERDICT_COLOURS["n/a"],
}


@dataclass(frozen=True)
class Mark:
    """What the verdicts found on a panel: one or two short lines, and the colour of the verdict that dominates."""

    text: str
    colour: str


@dataclass(frozen=True)
class Line:
    """One drawn line: x positions (point indices or epochs), values, ±1 standard-error band edges (NaN: none)."""

    label: str
    x: np.ndarray
    y: np.ndarray
    low: np.ndarray
    high: np.ndarray
    colour: str
    epoch: int | None = None


@dataclass(frozen=True)
class Panel:
    """One panel of the story figure; ``points`` empty means against epoch, ``cls`` the CLS point's x index."""

    key: str
    title: str
    lines: list[Line]
    points: list[str] = field(default_factory=list)
    log: bool = False
    mark: Mark | None = None
    epochs: list[int] = field(default_factory=list)
    cls: int | None = None


@dataclass(frozen=True)
class Story:
    """The story figure's content: its panels and what could not be drawn (and why)."""

    panels: list[Panel]
    missing: list[str]
    band: str


def _short(point: str) -> str:
    """Axis labels that fit a card: ``patch``, ``pos``, ``1`` .. ``12``, ``CLS``."""
    if point.startswith("block_"):
        return str(int(point.removeprefix("block_")))
    return {"patch_embed": "patch", "pos_embed": "pos", "cls": "CLS", "pooled": "pool"}.get(point, point)


def _lowered_ticks(labels: Sequence[str]) -> list[int]:
    """Indices of the labels drawn one line lower: a word right after a word (``patch`` and ``pos`` side by side run
    into each other at a card's width; block numbers and ``CLS`` after them fit)."""
    lowered: list[int] = []
    for i in range(1, len(labels)):
        if not labels[i].isdigit() and not labels[i - 1].isdigit() and i - 1 not in lowered:
            lowered.append(i)
    return lowered


def _signed(z: float) -> str:
    return "" if not math.isfinite(z) else f"{z:+.0f}" if abs(z) >= 10 else f"{z:+.1f}"


def _z_range(zs: Sequence[float]) -> str:
    finite = [z for z in zs if math.isfinite(z)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    return (
        f"z {_signed(low)}"
        if len(finite) == 1 or _signed(low) == _signed(high)
        else f"z {_signed(low)} to {_signed(high)}"
    )


def _mark(
    what: str, verdicts: Sequence[tuple[str, str, float]], good: str, bad: str, colours: Mapping[str, str]
) -> Mark | None:
    """A panel's mark from (point, verdict, z) rows: ``rises: holds 15/15 (z +46 to +137)`` and, on a second line, the
    contradicting points by name and the count of other verdicts; ``None`` when no point was judged."""
    judged = [(p, v, z) for p, v, z in verdicts if v != NA]
    if not judged:
        return None
    n = len(judged)
    agree = [z for _, v, z in judged if v == good]
    against = [(p, z) for p, v, z in judged if v == bad]
    other = n - len(agree) - len(against)
    first = f"{what}: {good} {len(agree)}/{n}" + (f" ({_z_range(agree)})" if agree else "")
    second = []
    if against:
        named = ", ".join(p for p, _ in against[:3]) + (", ..." if len(against) > 3 else "")
        second.append(f"{bad} {len(against)}: {named} ({_z_range([z for _, z in against])})")
    if other:
        second.append(f"{other} inconclusive or reversing")
    if len(against) > len(agree):
        colour = colours[bad]
    elif len(agree) == n:
        colour = colours[good]
    elif against:
        colour = _FINDING_COLOURS[REVERSES]
    else:
        colour = colours[INCONCLUSIVE]
    return Mark("\n".join([first, "; ".join(second)] if second else [first]), colour)


def _window_lines(results: Sequence[PredictionResult], points: Sequence[str]) -> list[Line]:
    """The first and the last window means of a prediction at its judged points (the table's numbers)."""
    index = {p: i for i, p in enumerate(points)}
    judged = [r for r in results if r.point in index and math.isfinite(r.trend.first)]
    if not judged:
        return []
    x = np.array([index[r.point] for r in judged], dtype=np.float64)
    lines = []
    for label, colour, level, se, span in (
        ("first", FIRST_COLOUR, "first", "first_uncertainty", "first_window"),
        ("last", LAST_COLOUR, "last", "last_uncertainty", "last_window"),
    ):
        trends: list[Trend] = [r.trend for r in judged]
        y = np.array([getattr(t, level) for t in trends])
        bands = [window_band(getattr(t, level), getattr(t, se), t.scale) for t in trends]
        windows = {getattr(t, span) for t in trends if getattr(t, span)}
        span_text = windows.pop() if len(windows) == 1 else ""
        name = f"{label} window" + (f", epoch{'s' if '-' in span_text else ''} {span_text}" if span_text else "")
        low, high = (np.array(b) for b in zip(*bands, strict=True))
        lines.append(Line(name, x, y, low, high, colour))
    return lines


def _depth_panel(agg: Aggregate, findings: Sequence[Finding], band_is_spread: bool) -> Panel | None:
    metric = "effective_rank"
    per_point = agg.mean.get(metric)
    if not per_point:
        return None
    points = [p for p in agg.points if p in per_point]
    epochs = sorted({int(e) for p in points for e in per_point[p][0]})
    bands = agg.bands(metric) if band_is_spread else agg.stderr_bands(metric)
    lines = []
    for epoch in epochs:
        x, y, low, high = [], [], [], []
        for i, p in enumerate(points):
            e, v = per_point[p]
            hit = np.flatnonzero(np.asarray(e) == epoch)
            if hit.size:
                x.append(i)
                y.append(float(v[hit[0]]))
                lo, hi = bands.get(p, (np.full(len(v), np.nan), np.full(len(v), np.nan)))
                low.append(float(lo[hit[0]]))
                high.append(float(hi[hit[0]]))
        lines.append(Line(f"epoch {epoch}", np.array(x, float), np.array(y), np.array(low), np.array(high), "", epoch))
    rows = [
        (f.point, f.verdict, f.trend.z if f.trend is not None else math.nan)
        for f in findings
        if f.claim == "rank_rises" and f.metric == metric
    ]
    mark = _mark("rises with training", rows, HOLDS, FAILS, _FINDING_COLOURS)
    return Panel(
        metric,
        "effective rank against depth, one line per epoch",
        lines,
        points,
        mark=mark,
        epochs=epochs,
        cls=points.index("cls") if "cls" in points else None,
    )


def _variance_panel(
    views: Mapping[str, Aggregate], point: str | None, results: Sequence[PredictionResult], band_is_spread: bool
) -> Panel | None:
    if point is None:
        return None
    lines = []
    for view in SPLIT_VIEWS:
        variance = views.get(view)
        series = variance.mean.get("total_variance", {}).get(point) if variance is not None else None
        if variance is None or series is None:
            return None
        epochs, values = (np.asarray(a, dtype=np.float64) for a in series)
        metric = "total_variance"
        bands = variance.bands(metric) if band_is_spread else variance.stderr_bands(metric)
        low, high = bands.get(point, (np.full(values.size, np.nan), np.full(values.size, np.nan)))
        word = "between images (image means)" if view == "between_image" else "within images (around the mean)"
        lines.append(Line(word, epochs, values, np.asarray(low), np.asarray(high), VARIANCE_COLOURS[view]))
    rows = [(r.point, r.verdict, r.trend.z) for r in results]
    mark = _mark("between-image share, predicted to fall", rows, CONSISTENT, INCONSISTENT, VERDICT_COLOURS)
    return Panel(
        "variance_split",
        f"variance between and within images, {point}",
        lines,
        log=True,
        mark=mark,
    )


def build_story(ctx: Context) -> Story:
    """The story's panels from the report's context; the effective-rank claim marks the first panel."""
    agg, views, findings, predictions = ctx.agg, ctx.aggregates, ctx.findings, ctx.predictions
    several = agg.n_runs > 1
    by_key = {(p.metric, p.view): (p, r) for p, r in predictions.items()}
    panels: list[Panel] = []
    missing: list[str] = []
    depth = _depth_panel(agg, findings, several)
    if depth is not None:
        panels.append(depth)
    else:
        missing.append("effective rank (not recorded)")
    blocks = [p for p in agg.points if p.startswith("block_")]
    deepest = blocks[-1] if blocks else None
    share = by_key.get(("between_image_fraction", "all"))
    variance = _variance_panel(views, deepest, list(share[1]) if share else [], several)
    if variance is not None:
        panels.append(variance)
    else:
        missing.append("variance between / within images (views not recorded)")
    for metric, view, title in STORY_PANELS:
        prediction, results = by_key.get((metric, view), (None, []))
        judged_points = {r.point for r in results}
        points = [p for p in agg.points if p in judged_points]
        lines = _window_lines(results, points)
        if prediction is None or not lines:
            missing.append(f"{title} (not recorded)")
            continue
        observable = CATALOGUE.get(metric)
        panels.append(
            Panel(
                metric,
                title,
                lines,
                points,
                log=observable is not None and observable.scale == "log",
                mark=_mark(
                    f"predicted {prediction.expected}",
                    [(r.point, r.verdict, r.trend.z) for r in results],
                    CONSISTENT,
                    INCONSISTENT,
                    VERDICT_COLOURS,
                ),
                cls=points.index("cls") if "cls" in points else None,
            )
        )
    band = "mean ± 1 standard deviation over runs" if several else "±1 jackknife standard error"
    return Story(panels, missing, band)


@dataclass(frozen=True)
class _Style:
    """Text sizes and line widths of one layout (the report page, or a 480 px TensorBoard card)."""

    title: float
    ticks: float
    label: float
    mark: float
    legend: float
    suptitle: float
    mark_width: int  # characters per line of a mark before it wraps


_PAGE = _Style(title=10.0, ticks=8.0, label=8.0, mark=7.5, legend=7.0, suptitle=11.0, mark_width=78)
_CARD = _Style(title=14.0, ticks=12.5, label=12.5, mark=12.5, legend=11.5, suptitle=14.0, mark_width=52)
CARD_SIZE = (6.0, 3.0)
CARD_DPI = 80
"""A story card is 480 x 240 px: TensorBoard shows an image in a card of about 365-450 x 180-210 px (its settings
pane open or not), so one panel per card, with text of at least 12.5 pt (~14 px drawn, ~11 px on screen at 1400 px
wide; the 8 pt it had read as "ho ds 0/15"), keeps it readable."""


def _headroom(ax: Axes, lines: int) -> None:
    """Raises the top of the y axis so the mark (``lines`` lines of text at the top left) covers no data."""
    share = 0.16 * lines
    low, high = ax.get_ylim()
    if ax.get_yscale() == "log":
        ax.set_ylim(low, high * (high / low) ** share)
    else:
        ax.set_ylim(low, high + share * (high - low))


def _draw_depth_lines(ax: Axes, panel: Panel, style: _Style) -> None:
    norm, cmap = epoch_colours(panel.epochs) if panel.epochs else (None, None)
    for line in panel.lines:
        colour: Any = line.colour
        if norm is not None and cmap is not None and line.epoch is not None:
            colour = cmap(norm(line.epoch))
        keep = np.ones(line.x.size, dtype=bool) if panel.cls is None else line.x != panel.cls
        ax.plot(line.x[keep], line.y[keep], color=colour, lw=1.4, marker="o", ms=2.5, label=line.label)
        if np.any(keep & np.isfinite(line.low) & np.isfinite(line.high)):
            ax.fill_between(line.x[keep], line.low[keep], line.high[keep], color=colour, alpha=0.2, lw=0)
        if panel.cls is not None and np.any(~keep):
            i = int(np.flatnonzero(~keep)[0])
            err = None
            if np.isfinite(line.low[i]) and np.isfinite(line.high[i]):
                err = [[line.y[i] - line.low[i]], [line.high[i] - line.y[i]]]
            ax.errorbar(
                line.x[i], line.y[i], yerr=err, color=colour, marker="s", ms=5, mec=CLS_COLOUR, mew=1.0, capsize=2
            )
    if panel.cls is not None:
        ax.axvline(panel.cls - 0.5, color="#999999", lw=0.6, ls=":")
    labels = [_short(p) for p in panel.points]
    ax.set_xticks(range(len(panel.points)), labels=labels, fontsize=style.ticks)
    ticks = ax.xaxis.get_major_ticks()
    for i in _lowered_ticks(labels):  # the default pad (points) and one line of tick text below it
        ticks[i].set_pad(float(matplotlib.rcParams["xtick.major.pad"]) + 1.2 * style.ticks)
    ax.set_xlim(-0.5, len(panel.points) - 0.5)
    if norm is not None and cmap is not None:
        epoch_colourbar(ax.figure, ax, norm, cmap, panel.epochs, fontsize=style.label)  # type: ignore[arg-type]
    else:
        ax.legend(fontsize=style.legend, loc="center right", frameon=False)


def _draw_epoch_lines(ax: Axes, panel: Panel, style: _Style) -> None:
    for line in panel.lines:
        ax.plot(line.x, line.y, color=line.colour, lw=1.6, marker="o", ms=3, label=line.label)
        if np.any(np.isfinite(line.low) & np.isfinite(line.high)):
            ax.fill_between(line.x, line.low, line.high, color=line.colour, alpha=0.2, lw=0)
    ax.set_xlabel("epoch", fontsize=style.label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=style.legend, loc="lower right", frameon=False)


def _draw_panel(ax: Axes, panel: Panel, style: _Style) -> None:
    """One panel: its lines, log axis, title and the verdict mark in its top left corner (above the data)."""
    if panel.points:
        _draw_depth_lines(ax, panel, style)
    else:
        _draw_epoch_lines(ax, panel, style)
    if panel.log:
        log_axis(ax)
    text = panel.mark.text if panel.mark is not None else "one observation: nothing judged"
    text = "\n".join(textwrap.fill(line, style.mark_width, subsequent_indent="  ") for line in text.split("\n"))
    _headroom(ax, text.count("\n") + 1)
    ax.set_title(panel.title, fontsize=style.title)
    ax.tick_params(axis="both", which="both", labelsize=style.ticks)  # a log axis' minor labels too
    ax.grid(True, alpha=0.25)
    colour = panel.mark.colour if panel.mark is not None else VERDICT_COLOURS["n/a"]
    ax.text(
        0.015,
        0.975,
        text,
        transform=ax.transAxes,
        va="top",
        ha="left",
        fontsize=style.mark,
        color="white",
        bbox={"boxstyle": "round,pad=0.3", "facecolor": colour, "edgecolor": "none", "alpha": 0.92},
        zorder=5,
    )


def story_figure(story: Story) -> Figure:
    """Draws the story for the report's page: 3 x 2 panels (fewer when some are not recorded) at page width."""
    count = max(len(story.panels), 1)
    columns = min(3, count)
    rows = math.ceil(count / columns)
    fig = Figure(figsize=(5.0 * columns, 3.7 * rows + 0.5), dpi=90, layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax, panel in zip(axes.flat, story.panels, strict=False):
        _draw_panel(ax, panel, _PAGE)
    for ax in list(axes.flat)[len(story.panels) :]:
        ax.set_visible(False)
    title = "Does training spread the variance over more directions, where, and why?"
    if story.missing:
        title += "\nnot drawn: " + "; ".join(story.missing)
    fig.suptitle(title, fontsize=_PAGE.suptitle)
    return fig


def story_cards(story: Story) -> dict[str, Figure]:
    """The story as TensorBoard cards, named ``<n>_<panel>`` in the figure's order."""
    cards = {}
    for i, panel in enumerate(story.panels, start=1):
        fig = Figure(figsize=CARD_SIZE, dpi=CARD_DPI, layout="constrained")
        _draw_panel(fig.add_subplot(), panel, _CARD)
        cards[f"{i}_{panel.key}"] = fig
    return cards


def story_caption(story: Story) -> str:
    """The story figure's caption on the report page: what each panel draws and what its mark is."""
    parts = [
        "The TGO-I story in one figure, drawn from this report's records. Panel marks state the verdicts of the "
        "tables below (green: agrees everywhere judged; red: contradicted at most points; amber: mixed; blue: "
        "inconclusive)."
    ]
    for panel in story.panels:
        if panel.key == "effective_rank":
            parts.append(
                "Effective rank against depth, one line per observed epoch (colourbar), bands "
                f"{story.band}; CLS is the square after the dotted line; mark: the findings' 'effective rank rises'."
            )
        elif panel.key == "variance_split":
            parts.append(
                f"{panel.title}: the trace of the covariance of the image means (between images) and of the tokens "
                f"around their image mean (within images), log axis, bands {story.band}; mark: the prediction that "
                "the between-image share falls, over every point it is judged at."
            )
        else:
            parts.append(
                f"{panel.title} against depth: the first and the last window means the Hypotheses table judges, "
                f"bands ±1 paired jackknife standard error of each window mean (for several runs the mean's, taken "
                "replicate by replicate)" + (", log axis" if panel.log else "") + "."
            )
    if story.missing:
        parts.append("Not drawn: " + "; ".join(story.missing) + ".")
    return " ".join(parts)


def run_story(run_dir: str | os.PathLike[str], epoch: int | None = None) -> Story | None:
    """The story of one run up to ``epoch``, judged as a report would judge it then; ``None`` without effective rank."""
    ctx = judge([load_run_data(run_dir, os.path.basename(os.fspath(run_dir)) or "run")], until=epoch)
    if "effective_rank" not in ctx.agg.mean:
        return None
    return build_story(ctx)


def story_section(ctx: Context) -> list[Section]:
    """The story figure as the page's first section; none when no panel can be drawn."""
    story = build_story(ctx)
    if not story.panels:
        return []
    path = save_figure(story_figure(story), ctx.figures_dir, "story")
    return [
        Section("The story in one figure", "story", figures=[FigureRef("story", path, story_caption(story), wide=True)])
    ]


def run_story_cards(run_dir: str | os.PathLike[str], epoch: int | None = None) -> dict[str, Figure] | None:
    """The callback's default story: `story_cards` of `run_story`, drawn on the figure worker's thread."""
    story = run_story(run_dir, epoch)
    return None if story is None else story_cards(story)
