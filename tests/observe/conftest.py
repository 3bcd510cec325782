"""Fixtures of the observe tests: the shared smoke run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.report.smoke import smoke_run_dir


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished smoke run directory (trained once per session)."""
    return smoke_run_dir(tmp_path_factory)
