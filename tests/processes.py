"""What the multi-process tests share: a free port for a gloo rendezvous and the environment a process joins it with,
ranks forked from the test process, the small ViT each process builds, the one-epoch Lightning fit of the sharded
tests, the rows two runs are compared by, and a signal sent to a command-line process once it has reached a given
point.

Lightning is imported inside `fit_observed` only, so a spawned process (DeepSpeed's test, or `fork_ranks` where it
cannot fork) imports this quickly.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch


def free_port() -> int:
    """A TCP port free on this machine now (``MASTER_PORT`` of one spawned group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fork_ranks(fn: Callable[..., None], args: tuple[Any, ...], world: int) -> None:
    """``fn(rank, *args)`` on ``world`` processes forked from this one, joined (``torch.multiprocessing.spawn``'s
    contract: a rank's exception is raised here), each computing with one torch thread as the test process does.

    For the tests of real processes summing over a real gloo collective, not of how a process starts: a forked rank
    has this process's modules already imported, where a spawned one pays a fresh interpreter and its imports of torch,
    timm and tgo (seconds of CPU each, most of such a test). A rank that seeds its model computes what a spawned one
    would. Spawned instead while this process has a default process group of its own (a forked rank would inherit it).
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    method = "spawn" if dist.is_available() and dist.is_initialized() else "fork"
    mp.start_processes(_one_thread, args=(fn, args), nprocs=world, join=True, start_method=method)


def _one_thread(rank: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    fn(rank, *args)


def join_as_torchrun_would(rank: int, world: int, port: int, **extra: str) -> None:
    """The environment of rank ``rank`` of ``world`` processes started outside Lightning (as torchrun would start them,
    so Lightning launches none of its own), one thread each; ``extra`` adds variables (``DS_ACCELERATOR="cpu"``)."""
    torch.set_num_threads(1)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world), "NODE_RANK": "0"}
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank), **extra)


def fit_observed(
    module: Any,
    strategy: Any,
    *,
    world: int,
    out: str,
    analysis: Any,
    settings: Mapping[str, Any],
    precision: str = "32-true",
) -> Any:
    """One epoch of ``module`` on the first 8 analysis images, 2 per step, under ``strategy`` on ``world`` CPU
    processes, the geometry callback observing ``analysis`` (a ``TensorDataset``) with ``settings`` and recording into
    ``out``; the trainer, after every rank has finished (no rank tears gloo down while another still uses it)."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from tgo.callbacks.spectral_geometry import SpectralGeometryCallback

    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        precision=precision,
        strategy=strategy,
        max_epochs=1,
        default_root_dir=out,
        callbacks=[SpectralGeometryCallback(analysis=analysis, **settings)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    pixels, labels = analysis.tensors
    trainer.fit(module, DataLoader(TensorDataset(pixels[:8], labels[:8]), batch_size=2))
    return trainer


def tiny_vit() -> torch.nn.Module:
    """The same 2-block, width-32 timm ViT at 16 px (3 classes) in every process: seed 0, eval mode."""
    import timm

    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3
    ).eval()


def epoch_rows(run: Path, epoch: int) -> dict[tuple[str, str, str], tuple[float, float]]:
    """``{(point, view, metric): (value, stderr)}`` of one recorded epoch: what two runs are compared by."""
    from tgo.records import read_metric_rows

    return {
        (r["point"], r["view"], r["metric"]): (float(r["value"]), float(r["stderr"]))
        for r in read_metric_rows(run)
        if int(r["epoch"]) == epoch
    }


def same_to_1e10(a: float, b: float) -> bool:
    """Equal to 1e-10 relative (1e-12 absolute near zero), or both NaN: the bar of the sharded comparisons."""
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-10, abs_tol=1e-12)


def assert_observed_alike(one: Path, sharded: Path, views: set[str]) -> None:
    """A sharded fit's epoch 0 records what ``one`` (the unsharded model in one process) records, every value and
    standard error to 1e-10, with ``views`` among them; its epoch 1 (trained, observed again) has the same rows."""
    import numpy as np

    want, got = epoch_rows(one, 0), epoch_rows(sharded, 0)
    assert {view for _, view, _ in want} >= views
    assert list(got) == list(want)
    compared = 0
    for key, (value, stderr) in want.items():
        if key[2] == "n_clamped":  # a sign of round-off, not a measurement
            continue
        assert same_to_1e10(got[key][0], value) and same_to_1e10(got[key][1], stderr), (key, got[key], value)
        compared += math.isfinite(value)
    assert compared > 0.8 * len(want)
    after = epoch_rows(sharded, 1)
    assert list(after) == list(want) and np.isfinite([v for v, _ in after.values()]).mean() > 0.8


def terminate_when(
    proc: subprocess.Popen, reached: Callable[[], bool], what: str, *, limit_s: float = 240.0
) -> tuple[int, str]:
    """Sends SIGTERM to ``proc`` as soon as ``reached()`` holds, waits for it and returns (its status, its stderr).

    The limit bounds a hung process; it is not a timing assertion. The process is killed if anything goes wrong.

    Args:
        proc: A process started with ``stderr=subprocess.PIPE, text=True``.
        reached: What must be true on disk before the signal (e.g. a figure of the new report exists).
        what: Names the process in the failure when it ends before ``reached()`` (``training``, ``the report``).
        limit_s: Seconds to wait for ``reached()``, then for the process to end.
    """
    try:
        deadline = time.monotonic() + limit_s
        while not reached():
            assert proc.poll() is None and time.monotonic() < deadline, f"{what} ended before it could be stopped"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=limit_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stderr
