"""Shared fixtures: composing the real config tree with Hydra's compose API into temporary run directories."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

from tgo.config import CONFIG_MODULE
from tgo.observatory.settings import FigureSettings

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"

# Every test process computes with one torch thread (its CLI subprocesses too, through OMP_NUM_THREADS): float sums
# depend on the thread count and training amplifies their last digits, so two runs of one test process agree bit for
# bit whatever the core count; `make test` spreads the files over pytest-xdist workers instead. The bits still depend
# on the CPU's kernels and BLAS build, so no test compares them with a stored copy
# (tests/records/test_golden.py).
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


def compose_train(output_dir: Path, overrides: list[str] | None = None, *, hydra_cfg: bool = False) -> DictConfig:
    """Composes conf/train.yaml like ``python -m tgo.train`` would, with the run directory set to ``output_dir``."""
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        # Progress bars off: tqdm would interleave with pytest's own output (the CLI tests keep the default).
        return compose(
            "train",
            overrides=[f"paths.output_dir={output_dir}", "trainer.enable_progress_bar=false", *(overrides or [])],
            return_hydra_config=hydra_cfg,
        )


def run_cli(
    args: list[str], cwd: Path, timeout: int = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs ``python -m tgo.train ARGS`` in a fresh interpreter, as a user would (``env``: its environment)."""
    env = {**(os.environ if env is None else env), "TGO_ROOT": str(cwd), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tgo.train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


NO_FIGURES = [f"observation.figures.{f.name}=false" for f in fields(FigureSettings) if isinstance(f.default, bool)]
"""Overrides that switch every TensorBoard figure off (scalars and records are unchanged): for tests that check
records, checkpoints or processes, not figures. The figures render on a background thread of the training process
and cost a smoke run more than its training (tests/callbacks/ test them; ``make run`` draws them)."""

SMOKE = ["experiment=smoke", *NO_FIGURES]
"""The shared smoke run's overrides: 2 epochs of the 4-block ViT on digits, observed at epochs 0, 1 and 2, without
TensorBoard figures (no test that shares the run reads them; they were two thirds of its CPU time): ~10 s."""
_SMOKE: dict[str, tuple[Path, dict[str, float]]] = {}


def _smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    if "run" not in _SMOKE:
        from tgo.train import run

        run_dir = tmp_path_factory.mktemp("smoke") / "run"
        metrics = run(compose_train(run_dir, SMOKE))
        _SMOKE["run"] = (run_dir, dict(metrics))
    return _SMOKE["run"]


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished ``experiment=smoke`` run directory (`SMOKE`), trained once per session (per pytest-xdist worker)
    for every test that reads one: read it, or copy it (``shutil.copytree``) to change it."""
    return _smoke(tmp_path_factory)[0]


@pytest.fixture(scope="session")
def smoke_metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """What ``tgo.train.run`` returned for `smoke_run` (the trainer's final callback metrics)."""
    return _smoke(tmp_path_factory)[1]


@pytest.fixture
def compose_cfg(tmp_path: Path):
    """Returns a function composing the config with overrides into ``tmp_path/run``."""

    def _compose(*overrides: str, hydra_cfg: bool = False) -> DictConfig:
        return compose_train(tmp_path / "run", list(overrides), hydra_cfg=hydra_cfg)

    return _compose


# ------------------------------------------------------------------------------------------ longest modules first
HEAVY_MODULES = {
    "tests/test_launch.py": 70,
    "tests/test_packaging.py": 60,
    "tests/report/test_build.py": 40,
    "tests/test_readme.py": 32,
    "tests/test_ddp.py": 25,
    "tests/test_resume.py": 20,
    "tests/callbacks/test_background.py": 25,
    "tests/report/test_reference_caveat.py": 15,
    "tests/report/test_hypotheses.py": 20,
    "tests/report/test_story.py": 15,
    "tests/benchmarks/test_smoke.py": 55,
    "tests/observatory/test_share.py": 10,
    "tests/test_safe_load.py": 22,
    "tests/test_train.py": 45,
    "tests/test_examples.py": 25,
    "tests/test_seed_replication.py": 14,
    "tests/tools/test_soak.py": 18,
    "tests/report/test_glance.py": 15,
    "tests/callbacks/test_spectral_geometry_callback.py": 15,
    "tests/families/test_attention.py": 14,
    "tests/observe/test_observe.py": 32,
    "tests/tools/test_gpu_check.py": 15,
    "tests/records/test_run_directory.py": 12,
    "tests/spectral/test_jackknife.py": 12,
}
"""Rough seconds of each long test module on the quiet 2-core machine (``make test``), for ordering only: a module
not listed counts 30 s per ``slow`` test. A wrong number costs some balance at the end of the run, never a result.
A module whose module-scoped fixture is costly (a whole report) is listed too: dealt whole at the head of a share,
no steal splits it, so the fixture is built once (a split module builds it again on each side)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Starts the long modules first on every pytest-xdist worker (longest processing time first).

    ``--dist worksteal`` first hands worker ``i`` of ``W`` the next ``remaining // (W - i)`` collected tests in order,
    and an idle worker later steals the *last* half of another's queue; in collection order the longest modules came
    last, so a worker could start a 100-s test while the other ran out of work. Here the heavy modules are dealt to
    the workers' shares by their `HEAVY_MODULES` seconds (each to the least loaded share), each share starting with
    its heavy modules and filled up with the other tests in collection order. Modules stay whole (their module
    fixtures are built once per worker) and keep their own test order; every worker collects the same order.
    """
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def seconds(path: str) -> float:
        slow = sum(1 for item in modules[path] if item.get_closest_marker("slow") is not None)
        return HEAVY_MODULES.get(path, 30.0 * slow)

    heavy = sorted((p for p in modules if seconds(p) > 0), key=lambda p: (-seconds(p), p))
    light = [group for path, group in modules.items() if path not in heavy]
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for path in heavy:
        share = loads.index(min(loads))
        shares[share].extend(modules[path])
        loads[share] += seconds(path)
    ends: list[int] = []
    remaining = len(items)
    for i in range(workers):  # where each worker's first batch ends: xdist hands worker i remaining // (W - i)
        remaining -= remaining // (workers - i)
        ends.append(len(items) - remaining)
    ordered: list[pytest.Item] = []
    for share, end in zip(shares, ends, strict=True):
        ordered += share
        for group in list(light):  # whole modules that still fit this share (first fit), so none is split at its end
            if len(ordered) + len(group) <= end:
                ordered += group
                light.remove(group)
        if len(ordered) < end and light:  # no module fits the gap exactly: the next one is split, as xdist would
            take = end - len(ordered)
            ordered += light[0][:take]
            light[0] = light[0][take:]
    items[:] = ordered + [item for group in light for item in group]
