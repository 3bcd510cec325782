"""The report page from a jinja2 template (``templates/page.html.j2``): inline CSS, no scripts, no CDN, so it opens
offline.

Figures are referenced as ``figures/<name>.png`` beside ``index.html`` or, with ``embed=True``, inlined as base64
data URIs so the single file can be mailed around. A section may hold subsections (``<h3>``, linked from a line at its
top), and a table may be folded into a ``<details>`` element whose one-line summary stays visible. Every text is
escaped by the template's autoescape.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from tgo.report.figures import FigureRef

__all__ = ["Section", "Table", "render_page"]

_VERDICT_CLASS = {
    "holds": "holds",
    "holds then reverses": "reverses",
    "inconclusive": "inconclusive",
    "does not hold": "fails",
    "n/a": "na",
    "consistent": "holds",
    "inconsistent": "fails",
    "not recorded": "na",
}


@dataclass
class Table:
    """A table whose cells are already formatted strings.

    Attributes:
        headers: Column names.
        rows: Cell strings per row.
        left: Indices of left-aligned (text) columns.
        verdict_column: Index of a verdict column: its row gets a colour class.
        summary: When given, the table is folded into ``<details>`` with this line as its visible summary.
    """

    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    left: Sequence[int] = ()
    verdict_column: int | None = None
    summary: str | None = None


@dataclass
class Section:
    """A titled part of the page: paragraphs, tables, a grid of figures, then subsections.

    Attributes:
        title: Heading.
        anchor: ``id`` for the table of contents.
        paragraphs: Plain-text paragraphs (escaped).
        tables: Tables, in order.
        figures: Figures, laid out in a wrapping grid (a `FigureRef` with ``wide`` takes the page's width).
        subsections: Sections one heading level down, after the figures (linked from a line under its heading).
        figures_first: Put the figures before the tables (a figure that the tables below it detail).
        caveats: Plain-text warnings drawn as a highlighted box before the paragraphs (escaped).
    """

    title: str
    anchor: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[FigureRef] = field(default_factory=list)
    subsections: list[Section] = field(default_factory=list)
    figures_first: bool = False
    caveats: list[str] = field(default_factory=list)


GENERATOR = "tgo.report"
"""The page's ``<meta name="generator">``: how a later report knows an ``index.html`` is TGO's to replace."""

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("tgo.report", "templates"), autoescape=True, undefined=jinja2.StrictUndefined
)


def render_page(title: str, sections: Sequence[Section], report_dir: Path, *, embed: bool = False) -> str:
    """The whole report page.

    Args:
        title: Page title and heading.
        sections: Sections in order (a line of links under the title reaches each).
        report_dir: The report directory (to read PNGs when embedding).
        embed: Inline figures as base64 instead of linking ``figures/*.png``.

    Returns:
        HTML text (UTF-8 safe; everything user-provided is escaped).
    """

    def image_src(figure: FigureRef) -> str:
        if not embed:
            return figure.path
        return "data:image/png;base64," + base64.b64encode((report_dir / figure.path).read_bytes()).decode("ascii")

    def verdict_class(verdict: object) -> str:
        return _VERDICT_CLASS.get(str(verdict).split(" (")[0], "")

    return _TEMPLATES.get_template("page.html.j2").render(
        title=title, sections=sections, generator=GENERATOR, image_src=image_src, verdict_class=verdict_class
    )
