"""``python -m benchmarks.gpu_check --device cpu --tiny``: the GPU acceptance check's code path, on the CPU.

The acceptance run itself needs a CUDA GPU (``make gpu-check``); what can rot without one is the script: it trains
through ``tgo.train.run``, reloads the checkpoint the way ``tgo.observe`` does and reaches into the observation
pipeline to time its phases. This runs it at toy size as ``make gpu-check ARGS="--device cpu --tiny"`` would (a fresh
interpreter) and checks the table, then shows that its equality checks can fail: with the observation's precision
guard broken the guard check fails and the exit status is 1, and a float32 observation does not pass for a float64
one, while a float64 one summed in a different order does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600  # a hang fails the test instead of blocking the suite; the tiny run takes well under a minute


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``python -m benchmarks.gpu_check --device cpu --tiny --out OUT`` once, in a fresh interpreter."""
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--tiny", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    return proc, out


def table_lines(stdout: str) -> dict[str, str]:
    """The printed table's lines by row name."""
    return {name: line for line in stdout.splitlines() for name in gpu_check.ROW_NAMES if line.startswith(name + " ")}


@pytest.mark.slow  # 20-40 s on 2 loaded cores: an interpreter start (torch, timm, Lightning), training, 8 observations
def test_tiny_cpu_run_prints_every_row_and_the_equality_checks_pass(tiny_run) -> None:
    proc, out = tiny_run
    assert proc.returncode == 0, f"gpu_check failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    lines = table_lines(proc.stdout)
    assert list(lines) == list(gpu_check.ROW_NAMES), proc.stdout[-4000:]
    for name in ("guard: TF32 + bf16 autocast", "device: float64 vs CPU float64"):
        assert " PASS " in lines[name], lines[name]
    # The eigendecomposition row says where it ran; timing rows have no verdict off the H200.
    assert "on the CPU: numpy.linalg.eigvalsh float64" in lines["eigendecomposition seconds"]
    assert "GPU float64 eigensolver calls: 0" in lines["eigendecomposition seconds"]
    assert " n/a " in lines["pass seconds"]

    results = json.loads((out / "results.json").read_text())
    assert results["exit_status"] == 0
    assert [r["name"] for r in results["rows"]] == list(gpu_check.ROW_NAMES)
    assert results["guard"]["worst"] <= gpu_check.TOLERANCE
    assert results["device_check"]["worst"] <= gpu_check.TOLERANCE
    assert results["guard"]["compared"] > 100  # eigenvalues and observables of every point and view
    epochs = [o["epoch"] for o in results["training"]["observations"]]
    assert epochs == [0, 2]  # the callback observed during training; blocking comes from its own timing
    assert Path(results["checkpoint"]).is_file()  # the saved checkpoint is kept in the run directory
    assert (out / "table.txt").read_text().count("PASS") >= 2


@contextlib.contextmanager
def broken_exact_inference() -> Iterator[None]:
    """The observation's precision guard reduced to inference mode: autocast and TF32 of the caller leak in."""
    from tgo.observatory import stream

    original = stream.exact_inference

    @contextlib.contextmanager
    def inference_only(device_type: str) -> Iterator[None]:
        with torch.inference_mode():
            yield

    stream.exact_inference = inference_only
    try:
        yield
    finally:
        stream.exact_inference = original


@pytest.mark.slow  # reuses the tiny run's checkpoint; ~10-20 s of observations (cold noise baselines included)
def test_a_broken_precision_guard_fails_the_check_with_exit_1(tiny_run, tmp_path, capsys) -> None:
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    checkpoint = out / "run" / "checkpoints" / "last.ckpt"
    argv = ["--device", "cpu", "--tiny", "--checkpoint", str(checkpoint), "--out", str(tmp_path)]
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with broken_exact_inference():
        status = gpu_check.main(argv)
    printed = capsys.readouterr().out
    lines = table_lines(printed)
    assert status == 1, printed[-3000:]
    assert " FAIL " in lines["guard: TF32 + bf16 autocast"], lines
    assert "equality checks FAILED" in printed
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["guard"]["worst"] > 1e-4  # bf16 in the forward: far beyond round-off
    # main restores what it switched on for the run.
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == allow_tf32


@pytest.mark.slow  # reuses the tiny run's checkpoint; four observations of 32 images
def test_the_equality_tolerance_separates_float32_from_float64_summation_order(tiny_run, tmp_path) -> None:
    """What the device check rests on: float64 observations summed in different orders (another batch size, as
    another device's kernels would) agree far inside 1e-9, and a float32 observation is far outside it."""
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    observed = gpu_check.load_observed(out / "run" / "checkpoints" / "last.ckpt")
    cpu = torch.device("cpu")
    images64 = gpu_check.first_images(observed.images, 32, torch.float64)
    reference = gpu_check.observe(observed, images64, cpu, tmp_path, torch.float64)
    reordered = gpu_check.observe(dataclasses.replace(observed, batch_size=5), images64, cpu, tmp_path, torch.float64)
    in_float32 = gpu_check.observe(observed, gpu_check.first_images(observed.images, 32), cpu, tmp_path)

    assert gpu_check.relative_difference(reordered, reference)["worst"] <= gpu_check.TOLERANCE / 100
    assert gpu_check.relative_difference(in_float32, reference)["worst"] > gpu_check.TOLERANCE * 100


def test_cuda_requested_without_a_gpu_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    status = gpu_check.main(["--device", "cuda", "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "torch.cuda.is_available() is False" in captured.err
    assert not (tmp_path / "out").exists()  # nothing started


def test_relative_difference_reports_the_worst_value_and_where() -> None:
    """Eigenvalues relative to the spectrum's largest, observables to their magnitude, diagnostics ignored."""
    import numpy as np

    from tgo.observatory import ObservationKey
    from tgo.spectral import Spectrum

    def result(eigs: list[float], rank: float, clamped: float) -> object:
        spectrum = Spectrum(np.asarray(eigs), n_rows=10, n_nonfinite=0, n_clamped=0, most_negative=0.0)
        observables = {"effective_rank": rank, "most_negative_eigenvalue": clamped}
        return type("R", (), {"spectrum": spectrum, "observables": observables})()

    key = ObservationKey("block_01")
    a = {key: result([4.0, 1.0, 0.0], 2.0, -1e-17)}
    b = {key: result([4.0, 1.0 + 4e-12, 0.0], 2.0 * (1 + 3e-10), -5e-16)}
    diff = gpu_check.relative_difference(a, b)
    assert diff["worst"] == pytest.approx(3e-10, rel=1e-3)
    assert diff["where"] == "block_01/all effective_rank"
    assert gpu_check.relative_difference(a, a)["worst"] == 0.0
    assert gpu_check.relative_difference(a, {})["worst"] == float("inf")


def test_a_missing_checkpoint_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    status = gpu_check.main(["--device", "cpu", "--checkpoint", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert status == 2
    missing = tmp_path / "nope.ckpt"
    assert captured.err.strip().splitlines() == [f"gpu_check: error: --checkpoint {missing}: no such file"]
