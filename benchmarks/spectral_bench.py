"""Benchmark of the spectral engine: streaming covariance vs a bare matmul and vs storing activations.

Run ``python benchmarks/spectral_bench.py`` (about a minute on 2 CPU cores), ``--quick`` (seconds) or ``--smoke``
(every shape shrunk, numbers meaningless). One table, all ratios from this one run: the throughput of
``StreamingCovariance.update`` (float64 and float32 Gram) against a bare float32 ``x^T x`` of the same shape, and one
whole observation of 15 points streamed against the naive store-then-``torch.cov``, in wall time and peak RSS
(`_harness.PeakRSS`; torch allocations are invisible to ``tracemalloc``). Times are the best of ``--repeats`` runs
(other processes only ever slow a run down), with the load average printed. Activations are synthetic ViT-like
batches made before timing, so only the engine is measured; docs/benchmarks.md reads the results.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

if __package__ in (None, ""):  # allow `python benchmarks/spectral_bench.py` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _harness as h
from benchmarks._table import render_columns
from tgo.spectral import StreamingCovariance, eigendecompose

MB = 1024**2


@dataclass(frozen=True)
class Shape:
    """The activations measured: ``points`` accumulators fed batches of ``[batch_images, tokens, dim]``.

    The defaults are ViT-S/16 at 224 px observed at 15 points; `SMOKE` is small enough to run in a second.
    """

    dim: int = 384
    tokens: int = 197
    points: int = 15
    batch_images: int = 32

    @property
    def rows_per_batch(self) -> int:
        """Rows of one batch as an accumulator sees them (tokens x images)."""
        return self.batch_images * self.tokens

    @property
    def streaming_held_bytes(self) -> int:
        """What the streaming method keeps by construction: one float64 ``[D, D] + [D] + [D]`` state per point."""
        return self.points * (self.dim * self.dim + 2 * self.dim) * 8


VIT_S = Shape()
SMOKE = Shape(dim=32, tokens=17, points=4, batch_images=4)


def make_pool(shape: Shape, n_batches: int = 4, seed: int = 0) -> list[torch.Tensor]:
    """ViT-like activation batches ``[batch_images, tokens, dim]`` (float32), power-law spectrum, massive dimensions."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.arange(1, shape.dim + 1, dtype=torch.float32) ** -0.75
    mean = torch.randn(shape.dim, generator=gen) * 0.1
    mean[:4] = torch.tensor([3e3, -2e3, 1.5e3, 1e3])  # mean/std >= 1e3
    mix = torch.linalg.qr(torch.randn(shape.dim, shape.dim, generator=gen))[0]
    return [
        (torch.randn(shape.batch_images, shape.tokens, shape.dim, generator=gen) * scales) @ mix.T + mean
        for _ in range(n_batches)
    ]


# ---------------------------------------------------------------------------------------------------- the phases
def _per_call(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds per call after one warm-up call."""
    fn()
    return h.median_time(fn, repeats)


def throughput(pool: list[torch.Tensor], shape: Shape, repeats: int) -> dict[str, float]:
    """Rows per second of the floor and of ``update`` with each Gram dtype."""
    rows = pool[0].reshape(-1, shape.dim)
    n = rows.shape[0]
    out = {"bare float32 matmul x^T x (floor)": n / _per_call(lambda: torch.mm(rows.T, rows), repeats)}
    for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
        acc = StreamingCovariance(shape.dim, gram_dtype=dtype)
        out[f"StreamingCovariance.update, gram {name}"] = n / _per_call(lambda: acc.update(pool[0]), repeats)
    return out


@dataclass
class ObservationCost:
    seconds: float
    peak_bytes: int
    held_bytes: int


def _feed(pool: list[torch.Tensor], shape: Shape, images: int, update: Callable[[int, torch.Tensor], None]) -> None:
    """``images`` images batch by batch to every point ``p`` (``update(p, batch)``), each point a different batch."""
    for step in range(-(-images // shape.batch_images)):
        take = min(shape.batch_images, images - step * shape.batch_images)
        for p in range(shape.points):
            update(p, pool[(step + p) % len(pool)][:take])


def streaming_observation(
    pool: list[torch.Tensor], shape: Shape, images: int, gram_dtype: torch.dtype
) -> ObservationCost:
    """One accumulator per point fed batch by batch, then covariance + float64 eigvalsh per point."""
    with h.PeakRSS() as mem:
        start = time.perf_counter()
        accs = [StreamingCovariance(shape.dim, gram_dtype=gram_dtype) for _ in range(shape.points)]
        _feed(pool, shape, images, lambda p, x: accs[p].update(x))
        for acc in accs:
            eigendecompose(acc.covariance(), acc.n, acc.n_nonfinite)
        seconds = time.perf_counter() - start
    return ObservationCost(seconds, mem.peak_delta, shape.streaming_held_bytes)


def naive_observation(pool: list[torch.Tensor], shape: Shape, images: int) -> ObservationCost:
    """Keep every activation of every point, then ``torch.cat`` + ``torch.cov`` + eigvalsh per point."""
    with h.PeakRSS() as mem:
        start = time.perf_counter()
        stored: list[list[torch.Tensor]] = [[] for _ in range(shape.points)]
        _feed(pool, shape, images, lambda p, x: stored[p].append(x.reshape(-1, shape.dim).clone()))
        for p in range(shape.points):
            rows = torch.cat(stored[p])
            stored[p] = []
            cov = torch.cov(rows.T)
            torch.linalg.eigvalsh(cov.double())
            del rows, cov
        seconds = time.perf_counter() - start
    held = shape.points * images * shape.tokens * shape.dim * 4
    return ObservationCost(seconds, mem.peak_delta, held)


def _best(run: Callable[[], ObservationCost], repeats: int) -> ObservationCost:
    """Fastest time and largest peak over ``repeats`` runs."""
    costs = [run() for _ in range(max(1, repeats))]
    return ObservationCost(min(c.seconds for c in costs), max(c.peak_bytes for c in costs), costs[0].held_bytes)


# ---------------------------------------------------------------------------------------------------- report
def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark and prints the tables (``argv``: the command line; ``None`` reads ``sys.argv``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if sys.platform.startswith("linux") and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        # glibc's dynamic mmap threshold keeps freed multi-MB tensors in the heap, so RSS would count every batch
        # temporary ever freed (~20 MB per accumulator here). A fixed 1 MB threshold returns them to the OS and makes
        # the measured peak the live memory. It must be set before the interpreter starts: rerun in a child.
        env = {**os.environ, **h.MALLOC_ENV}
        subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], env=env, check=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--quick", action="store_true", help="small sizes (32 and 128 images), a few seconds")
    modes.add_argument(
        "--smoke", action="store_true", help="tiny shapes and 8 images: checks that the script runs, measures nothing"
    )
    parser.add_argument("--images", type=int, nargs="+", default=None, help="image counts (default 256 1000)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per observation measurement (best time kept)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = SMOKE if args.smoke else VIT_S
    images_list = args.images or ([8] if args.smoke else [32, 128] if args.quick else [256, 1000])
    repeats = 1 if args.smoke else 3 if args.quick else 10
    obs_repeats = args.repeats or (1 if args.quick or args.smoke else 2)

    pool = make_pool(shape)
    print(
        f"spectral engine benchmark{' (smoke: tiny shapes, numbers mean nothing)' if args.smoke else ''}: "
        f"D={shape.dim}, {shape.tokens} tokens/image, batches of {shape.batch_images} images "
        f"({shape.rows_per_batch} rows), {shape.points} points, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
        f"best of {obs_repeats}"
    )
    print()
    rates = throughput(pool, shape, repeats)
    floor = next(iter(rates.values()))
    rates_rows = [(name, f"{rate:,.0f}", f"{rate / floor:.2f}x") for name, rate in rates.items()]
    print(render_columns(("throughput (one point)", "rows/s", "vs floor"), rates_rows, right={1, 2}, rule=False))
    print()
    cells: list[tuple[object, ...]] = []
    ratios: list[tuple[object, ...]] = []
    for images in images_list:
        runs = {
            "streaming, gram float64": lambda: streaming_observation(pool, shape, images, torch.float64),
            "streaming, gram float32": lambda: streaming_observation(pool, shape, images, torch.float32),
            "naive: store + torch.cov": lambda: naive_observation(pool, shape, images),
        }
        costs = {name: _best(run, obs_repeats) for name, run in runs.items()}
        for name, c in costs.items():
            mb = (f"{c.peak_bytes / MB:.1f}", f"{c.held_bytes / MB:.1f}")
            cells.append((name, images, images * shape.tokens, f"{c.seconds:.2f}", *mb))
        s64, s32, naive = costs.values()
        ratios.append(
            (
                f"{images} images",
                f"{naive.seconds / s64.seconds:.2f}x",
                f"{naive.seconds / s32.seconds:.2f}x",
                f"{naive.peak_bytes / max(s64.peak_bytes, 1):.1f}x",
                f"{naive.held_bytes / s64.held_bytes:.1f}x",
            )
        )
    header = (f"one observation, {shape.points} points", "images", "rows/pt", "time s", "peak MB", "held MB")
    print(render_columns(header, cells, right=range(1, 6)))
    print()
    header = ("ratios (naive / streaming)", "time f64", "time f32", "peak mem f64", "held mem")
    print(render_columns(header, ratios, right=range(1, 5), rule=False))
    print()
    print(
        "peak MB: measured RSS peak above the phase's start (includes per-batch temporaries; glibc mmap threshold "
        f"fixed at 1 MB so freed tensors leave RSS); held MB: bytes the method keeps by construction (streaming: "
        f"{shape.points} float64 [D,D]+[D]+[D] states; naive: all float32 activations)."
    )


if __name__ == "__main__":
    main()
