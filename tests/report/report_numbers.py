"""Every number a report shows, as a fixture: the pin that keeps a refactor of `tgo.report` number-neutral.

A snapshot holds the full content of ``findings.csv`` and ``hypotheses.csv`` (cell by cell) and every number of the
page's visible text, in reading order, as written (``block_12`` gives ``12``, ``+1.2e-05 ± 3.4e-06`` gives
``+1.2e-05`` and ``3.4e-06``). What differs between two builds of the same report is masked first: the build time,
the run's temporary path, the package version and the git commits. Regenerate after a change that is meant to move
a number (say why in the commit)::

    PYTHONPATH=. python -m tests.report.report_numbers
"""

from __future__ import annotations

import csv
import gzip
import json
import re
import tempfile
from html.parser import HTMLParser
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "report_numbers"
NUMBER = re.compile(r"[-+−]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?%?|\b[-+]?(?:nan|inf)\b")
_GENERATED = re.compile(r"Generated \d{4}-\d\d-\d\d \d\d:\d\d")
_VOLATILE_FIELDS = ("tgo version", "git commit (report)", "git commit (run)", "software (run)")
"""Header fields whose value (the next text) is the checkout's, not the report's."""


class _VisibleText(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._hidden += tag in ("head", "style", "script", "title")

    def handle_endtag(self, tag: str) -> None:
        self._hidden -= tag in ("head", "style", "script", "title")

    def handle_data(self, data: str) -> None:
        if not self._hidden and data.strip():
            self.texts.append(data)


def page_numbers(html: str, run_path: str | None = None) -> list[str]:
    """The numbers of the page's visible text, in order, as written, with what differs between builds masked."""
    parser = _VisibleText()
    parser.feed(html)
    numbers: list[str] = []
    previous = ""
    for text in parser.texts:
        if previous.strip() not in _VOLATILE_FIELDS:
            text = _GENERATED.sub("Generated <time>", text)
            if run_path:
                text = text.replace(run_path, "<run>")
            numbers += NUMBER.findall(text)
        previous = text
    return numbers


def read_cells(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.reader(fh))


def snapshot(report_dir: Path, run_path: Path | None = None) -> dict:
    """The report's CSVs (every cell) and page numbers."""
    index = (report_dir / "index.html").read_text(encoding="utf-8")
    csvs = {p.name: read_cells(p) for p in sorted(report_dir.glob("*.csv"))}
    return {"csv": csvs, "page": page_numbers(index, str(run_path) if run_path else None)}


def build_default_run(root: Path) -> tuple[Path, Path]:
    """The default-run fixture's report (as the tests build it: no correlation figures); (run, report dir)."""
    from tests.fixtures.default_run import materialize
    from tgo.report.build import build_report

    run = materialize(root / "run")
    return run, build_report([run], correlation=False).parent


def build_published(root: Path) -> Path:
    from tgo.report.build import build_published_report

    return build_published_report(root / "published").parent


def load(name: str) -> dict:
    with gzip.open(HERE / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        return json.load(fh)


def store(name: str, data: dict) -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    with open(HERE / f"{name}.json.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
        fh.write(json.dumps(data, indent=0, ensure_ascii=False).encode("utf-8"))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        run, report = build_default_run(Path(tmp))
        store("default_run", snapshot(report, run))
        store("published", snapshot(build_published(Path(tmp))))
    print(f"wrote {HERE}")
