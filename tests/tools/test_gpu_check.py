"""``python -m tools.gpu_check --device cpu --tiny``: the GPU acceptance check's code path, on the CPU.

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

from tools import gpu_check

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600  # a hang fails the test instead of blocking the suite; the tiny run takes well under a minute


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``python -m tools.gpu_check --device cpu --tiny --out OUT`` once, in a fresh interpreter."""
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--device", "cpu", "--tiny", "--out", str(out)],
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
    # The eigendecomposition row says which eigensolver setting the summary ran with; timing rows have no verdict
    # off the H200. The eigensolver rows capture the summary's stacks and time LAPACK on them; the GPU side is n/a.
    assert "observation.summary.eigensolver=auto" in lines["eigendecomposition seconds"]
    assert " n/a " in lines["pass seconds"]
    assert "| n/a s" in lines["eigensolver: CPU vs GPU time"] and " n/a " in lines["eigensolver: CPU vs GPU time"]
    assert "CPU LAPACK" in lines["eigensolver: CPU vs GPU time"]
    assert " n/a " in lines["eigensolver: GPU vs CPU values"]

    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["exit_status"] == 0
    assert [r["name"] for r in results["rows"]] == list(gpu_check.ROW_NAMES)
    assert results["guard"]["worst"] <= gpu_check.TOLERANCE
    assert results["device_check"]["worst"] <= gpu_check.TOLERANCE
    assert results["guard"]["compared"] > 100  # eigenvalues and observables of every point and view
    eig = results["eigensolver"]
    assert eig["stacks"] > 0 and eig["matrices"] > eig["stacks"]  # stacked: G + 1 matrices a (point, view)
    assert eig["cpu_s"] > 0 and eig["gpu_s"] is None and eig["worst"] is None
    epochs = [o["epoch"] for o in results["training"]["observations"]]
    assert epochs == [0, 2]  # the callback observed during training; blocking comes from its own timing
    assert Path(results["checkpoint"]).is_file()  # the saved checkpoint is kept in the run directory
    assert (out / "table.txt").read_text(encoding="utf-8").count("PASS") >= 2


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
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
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


def _stacks(count: int = 3, size: int = 4, dim: int = 12) -> list:
    """Symmetrised sample covariances in ``[size, dim, dim]`` stacks, as the summary hands them to its eigensolver."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        x = rng.standard_normal((size, 3 * dim, dim)) * np.exp(rng.uniform(-3, 3, dim))
        covs = np.einsum("sni,snj->sij", x, x) / (3 * dim - 1)
        out.append((covs + covs.transpose(0, 2, 1)) / 2)
    return out


def _rows(eig: dict, device: str, sharded: dict | None = None, zero3: dict | None = None) -> list:
    """The table's rows around an eigensolver result (and sharded results), every other measurement a placeholder."""
    timing = {
        "images": 32,
        "phases_s": {},
        "points": 5,
        "batch_size": 16,
        "repeats": 1,
        "forward_s": 0.0,
        "eig_calls": 0,
        "eig_stacked_calls": 0,
        "eig_call_seconds": 0.0,
        "eigensolver_setting": "auto",
        "whole_s": 0.0,
        "peak_mb": 0.0,
        "peak_above_model_mb": 0.0,
    }
    exact = {"worst": 0.0, "images": 32, "where": "nowhere", "compared": 1}
    return gpu_check.build_rows(
        gpu_check.TINY, torch.device(device), None, timing, exact, exact, None, eig, sharded, zero3
    )


def test_the_eigensolver_check_times_both_and_an_unequal_gpu_solver_fails_with_exit_1() -> None:
    """`compare_eigensolvers` with stand-ins for the GPU solver (no GPU here): one off by 1e-12 passes, one off by
    1e-7 fails the equality row and the exit status is 1; what ``auto`` would choose is reported per shape."""
    import numpy as np

    stacks = _stacks()
    close = gpu_check.compare_eigensolvers(stacks, 2, 1, lambda s: np.linalg.eigvalsh(s) * (1 + 1e-12))
    assert 0 < close["worst"] <= gpu_check.TOLERANCE
    assert close["cpu_s"] > 0 and close["gpu_s"] > 0 and close["faster"] in ("cpu", "gpu")
    assert close["matrices"] == 12 and close["shapes"] == {"4 x 12^2": 3} and close["compared"] == 12 * 12
    assert list(close["auto"]) == ["4 x 12^2"]
    rows = {r.name: r for r in _rows(close, "cuda")}
    assert [r.name for r in _rows(close, "cuda")] == list(gpu_check.ROW_NAMES)
    assert rows["eigensolver: GPU vs CPU values"].verdict == "PASS"
    timing_row = rows["eigensolver: CPU vs GPU time"]
    assert timing_row.verdict == "info" and f"{close['faster'].upper()} faster" in timing_row.detail
    assert gpu_check.exit_status(list(rows.values()), strict=False) == 0

    off = gpu_check.compare_eigensolvers(stacks, 2, 1, lambda s: np.linalg.eigvalsh(s) * (1 + 1e-7))
    assert off["worst"] == pytest.approx(1e-7, rel=1e-3)
    failed = _rows(off, "cuda")
    assert next(r for r in failed if r.name == "eigensolver: GPU vs CPU values").verdict == "FAIL"
    assert gpu_check.exit_status(failed, strict=False) == 1


def test_off_cuda_the_eigensolver_check_times_the_cpu_only_and_has_no_verdict() -> None:
    cpu_only = gpu_check.compare_eigensolvers(_stacks(), 2, 1, None)
    assert cpu_only["cpu_s"] > 0 and cpu_only["gpu_s"] is None and cpu_only["worst"] is None
    rows = {r.name: r for r in _rows(cpu_only, "cpu")}
    assert rows["eigensolver: CPU vs GPU time"].value.endswith("| n/a s")
    assert rows["eigensolver: CPU vs GPU time"].verdict == rows["eigensolver: GPU vs CPU values"].verdict == "n/a"
    assert gpu_check.exit_status(list(rows.values()), strict=True) == 0


def test_the_sharded_rows_hold_fsdp_to_float64_and_zero3_to_the_float32_layout_bar() -> None:
    """FSDP runs in float64 (the precision plugin keeps Lightning from casting the network and FSDP's compute to
    float32) and is held to 1e-9; ZeRO-3 has no float64, and cuBLAS's float32 kernels follow the gathered parameters'
    alignment (4e-06 to 5e-06 measured on an H100), so its bar is 1e-4, far below a dropped or doubled
    image (~3e-02)."""
    plugin = gpu_check.float64_fsdp_precision()
    assert plugin.convert_module(torch.nn.Linear(2, 2)).weight.dtype == torch.float64
    assert plugin.convert_input(torch.zeros(2)).dtype == torch.float64 and plugin.mixed_precision_config is None
    eig = gpu_check.compare_eigensolvers(_stacks(), 2, 1, None)

    def verdicts(sharded_worst: float, zero3_worst: float) -> tuple[str, str]:
        def result(worst: float) -> dict:
            return {"worst": worst, "images": 32, "where": "cls/cls nc1", "compared": 891}

        rows = {r.name: r for r in _rows(eig, "cuda", result(sharded_worst), result(zero3_worst))}
        return (
            rows["sharded: Lightning fsdp vs unsharded"].verdict,
            rows["sharded: Lightning deepspeed ZeRO-3 vs unsharded"].verdict,
        )

    assert verdicts(0.0, 5.0e-6) == ("PASS", "PASS")
    assert verdicts(7.1e-6, 5.0e-6)[0] == "FAIL"  # the float32-cast FSDP of the first H100 run
    assert verdicts(0.0, 3e-2)[1] == "FAIL"
