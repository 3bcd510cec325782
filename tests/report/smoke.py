"""One smoke training run per test session, shared by tests/report and tests/observe (it takes ~30 s on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import compose_train

_CACHE: dict[str, Path] = {}


def smoke_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Trains ``experiment=smoke`` (2 epochs, observations at 0, 1, 2) once and returns its run directory."""
    if "run" not in _CACHE:
        from tgo.train import run

        run_dir = tmp_path_factory.mktemp("smoke") / "run"
        run(compose_train(run_dir, ["experiment=smoke", "observation.figures.heatmaps=false"]))
        _CACHE["run"] = run_dir
    return _CACHE["run"]
