"""PNGs in the report tests: the signature every figure file starts with, and a way to make and save every figure
without rasterising it, for tests that read a report's CSVs and text while another test checks the same PNGs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def rasterise_no_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every figure is still made (its data, axes and artists) and saved, but ``savefig`` writes the PNG signature alone
    instead of drawing and encoding the image (about 60 % of a figure's CPU time): for tests that read a report's CSVs
    and text, not its images, when a test that checks the PNGs draws the same figures from the same kind of records
    (`test_report_of_the_smoke_run`, `test_a_sweep_directory_is_searched_for_runs_and_reported_together`,
    `test_published_writes_the_findings_of_the_shipped_measurements_alone`)."""
    from matplotlib.figure import Figure

    def savefig(self: Figure, fname: Any, *args: Any, **kwargs: Any) -> None:
        if hasattr(fname, "write"):
            fname.write(PNG_MAGIC)
        else:
            Path(fname).write_bytes(PNG_MAGIC)

    monkeypatch.setattr(Figure, "savefig", savefig)
