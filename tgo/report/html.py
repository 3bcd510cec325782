"""A small, dependency-free HTML writer for the report: inline CSS, no scripts, no CDN, so it opens offline.

Figures are referenced as ``figures/<name>.png`` beside ``index.html`` or, with ``embed=True``, inlined as base64
data URIs so the single file can be mailed around. A section may hold subsections (``<h3>``, linked from a line at its
top), and a table may be folded into a ``<details>`` element whose one-line summary stays visible.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tgo.report.figures import FigureRef

__all__ = ["Section", "Table", "render_page"]

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
tr.holds td.v { background: #d9f2d9; } tr.reverses td.v { background: #fff1c9; }
tr.fails td.v { background: #f8d7d7; } tr.na td.v { background: #eee; }
tr.inconclusive td.v { background: #e3ecf7; }
.grid { display: flex; flex-wrap: wrap; gap: 10px; }
figure { margin: 0; max-width: 560px; } figure img { max-width: 100%; border: 1px solid #eee; }
figure.wide { max-width: 100%; } h3 { font-size: 1.05em; margin-top: 1.4em; }
details { margin: 0.3em 0; } summary { cursor: pointer; font-size: 0.85em; }
figcaption { font-size: 0.75em; color: #555; }
.note { font-size: 0.85em; color: #444; }
.caveat { font-size: 0.9em; background: #fff4ce; border-left: 4px solid #d99a00; padding: 4px 8px; }
code { background: #f4f4f4; padding: 0 3px; }
nav.contents { font-size: 0.85em; line-height: 1.6; } .sub-contents { font-size: 0.8em; }
"""

_WIDE = ' class="wide"'
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

    def render(self) -> str:
        """The table as HTML."""

        def cls(i: int) -> str:
            return ' class="l"' if i in self.left else ""

        head = "".join(f"<th{cls(i)}>{html.escape(h)}</th>" for i, h in enumerate(self.headers))
        body = []
        for row in self.rows:
            row_cls = ""
            if self.verdict_column is not None:
                row_cls = f' class="{_VERDICT_CLASS.get(str(row[self.verdict_column]).split(" (")[0], "")}"'
            cells = "".join(
                f'<td class="{"l " if i in self.left else ""}{"v" if i == self.verdict_column else ""}">'
                f"{html.escape(str(c))}</td>"
                for i, c in enumerate(row)
            )
            body.append(f"<tr{row_cls}>{cells}</tr>")
        table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        if self.summary is None:
            return table
        return f"<details><summary>{html.escape(self.summary)}</summary>{table}</details>"


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


def _image_src(figure: FigureRef, report_dir: Path, embed: bool) -> str:
    if not embed:
        return html.escape(figure.path)
    data = base64.b64encode((report_dir / figure.path).read_bytes()).decode("ascii")
    return f"data:image/png;base64,{data}"


GENERATOR = "tgo.report"
"""The page's ``<meta name="generator">``: how a later report knows an ``index.html`` is TGO's to replace."""


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
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="generator" content="{GENERATOR}"><title>{html.escape(title)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>{_contents(sections)}"
    ]
    for s in sections:
        parts += _render_section(s, report_dir, embed, level=2)
    parts.append("</body></html>")
    return "\n".join(parts)


def _contents(sections: Sequence[Section]) -> str:
    """One line of links to the sections (a subsection is reached from its section's own line of links), so the
    page's first screen is the header and the story figure rather than a table of contents."""
    if not sections:
        return ""
    items = " · ".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in sections)
    return f'<nav class="contents">{items}</nav>'


def _render_section(s: Section, report_dir: Path, embed: bool, level: int) -> list[str]:
    parts = [f'<h{level} id="{s.anchor}">{html.escape(s.title)}</h{level}>']
    if s.subsections:
        links = " · ".join(f'<a href="#{sub.anchor}">{html.escape(sub.title)}</a>' for sub in s.subsections)
        parts.append(f'<p class="sub-contents">In this section: {links}</p>')
    parts += [f'<p class="caveat">{html.escape(c)}</p>' for c in s.caveats]
    parts += [f'<p class="note">{html.escape(p)}</p>' for p in s.paragraphs]
    figures = []
    if s.figures:
        figs = "".join(
            f'<figure{_WIDE if f.wide else ""}><img src="{_image_src(f, report_dir, embed)}" '
            f'alt="{html.escape(f.caption)}"><figcaption>{html.escape(f.caption)}</figcaption></figure>'
            for f in s.figures
        )
        figures.append(f'<div class="grid">{figs}</div>')
    tables = [t.render() for t in s.tables]
    parts += figures + tables if s.figures_first else tables + figures
    for sub in s.subsections:
        parts += _render_section(sub, report_dir, embed, level=min(level + 1, 6))
    return parts
