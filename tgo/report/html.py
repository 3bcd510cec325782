"""The report page from a jinja2 template (``templates/page.html.j2``): inline CSS, no scripts, no CDN, so it opens
offline; with ``embed=True`` the figures are inlined as base64 so the single file can be mailed around. Every text is
escaped by the template's autoescape."""

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
    """A table of formatted cells; ``summary`` folds it into ``<details>`` with that line visible."""

    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    left: Sequence[int] = ()
    verdict_column: int | None = None
    summary: str | None = None


@dataclass
class Section:
    """A titled part of the page: caveats, paragraphs, tables and a grid of figures (or figures first), then subsections
    one heading level down."""

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
    """The whole report page as HTML text, linking or (``embed``) inlining its figures."""

    def image_src(figure: FigureRef) -> str:
        if not embed:
            return figure.path
        return "data:image/png;base64," + base64.b64encode((report_dir / figure.path).read_bytes()).decode("ascii")

    def verdict_class(verdict: object) -> str:
        return _VERDICT_CLASS.get(str(verdict).split(" (")[0], "")

    return _TEMPLATES.get_template("page.html.j2").render(
        title=title, sections=sections, generator=GENERATOR, image_src=image_src, verdict_class=verdict_class
    )
