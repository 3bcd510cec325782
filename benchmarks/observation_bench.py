"""What observing costs: ``python -m benchmarks`` (``make bench``; ``make bench ARGS=--quick`` for ~3 minutes).

Prints one table (`benchmarks._table`) and writes it, with the environment, to ``bench_out/<timestamp>/results.json``.
This module measures rows 1-9: the observation against a plain forward (1), the naive store-then-``torch.cov``
baseline (2), memory scaling (3), training overhead (4), eigendecomposition and figures (5), the GPU (6, with CUDA),
the jackknife groups (7), the probes (8) and the attention family (9, `attention_bench`); rows 10-13 come from
`summary_bench`, `scale_bench`, `optimisation_bench` and `curvature_bench`, and `spectral_bench` (the engine alone)
runs first in its own process. Every figure is a median or a ratio measured in this one run (how timings are
interleaved: ``benchmarks/_harness.py``); every "ours" figure runs the default ``ObservationSettings`` (G = 10
jackknife groups, the probes on) and says so in its detail. docs/benchmarks.md says what each row measures. No
assertions anywhere: this measures.

``--smoke`` runs every row on a 2-block, width-32 ViT and a handful of images in well under a minute: it keeps the
benchmarks from rotting (``tests/benchmarks/test_smoke.py`` runs it) and its numbers mean nothing. Every declared row is
then present in ``results.json``, measured or skipped with a reason; the exit status is 1 when one is missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import lightning as L
import torch

from benchmarks import _harness as h
from benchmarks._table import GPU_ROWS, ROWS, SECTIONS, Table, quiet
from benchmarks.attention_bench import attention_rows
from benchmarks.callback_cost_bench import callback_cost_rows
from benchmarks.curvature_bench import curvature_rows
from benchmarks.families_bench import family_rows
from benchmarks.optimisation_bench import optimisation_rows
from benchmarks.peer_bench import peer_rows
from benchmarks.scale_bench import scale_rows
from benchmarks.summary_bench import summary_rows
from benchmarks.width_bench import width_rows

GOAL = 1.10
BLOCKING_TARGET = 1.15
"""Target of row 4.3: the time an observation holds the training thread / its pass (figures render in background)."""
GROUPS_TARGET = 1.05
"""Target of rows 7.1-7.2: the streaming pass with G jackknife groups / the same pass with G = 0."""
PROBES_TARGET = 1.10
"""Target of rows 8.1-8.2: the streaming pass with the probes' per-image vectors / the same pass without."""
PROBE_CLASSES = 10
"""Labels dealt round robin to the random images of rows 8 (the class probes need classes; 1a's images have one)."""
EXTRAPOLATED_IMAGES = 1000
"""The analysis-subset size rows 8.3 and 8.5 extrapolate to (TGO-I's subset)."""
MB = 1024**2
NO_GROUPS = "float64 G=0"
"""The variant of rows 1a/1b run with ``groups=0`` for rows 7 (float64 Gram, otherwise default settings)."""
FIGURE_SWITCHES = tuple(h.figures_off())
"""Every ``observation.figures`` kind that can be switched off (``story``, ``spectra``, ...)."""
SMOKE_FIGURES = ("spectra", "histograms", "decay")
"""The kinds ``--smoke`` draws in rows 5.3-5.4 (one per-point card of each sort; the others are off): drawing every
kind would cost the smoke run most of its time and exercise nothing of the benchmark's own code more."""


# ---------------------------------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class ModelSpec:
    """A network the table measures (its `_harness.build_model` kind, also the memory child's MODEL argument), with
    the sizes its labels and by-construction figures need."""

    kind: str
    name: str
    image_size: int
    width: int  # D of every observation point
    depth: int  # transformer blocks
    tokens: int  # per image, prefix included
    arch: Mapping[str, int] | None = None  # keys replaced in conf/model/vit_quickstart.yaml (quickstart kind only)

    @property
    def label(self) -> str:
        return f"{self.name} {self.image_size}px"

    @property
    def points(self) -> int:
        """Observation points of ``vit_points``: patch_embed, pos_embed, one per block, cls."""
        return self.depth + 3

    def build(self, device: torch.device | str) -> torch.nn.Module:
        return h.build_model(self.kind, device, self.image_size, arch=dict(self.arch or {}))


VIT_SMALL = ModelSpec("vit_small", "vit_small", 224, width=384, depth=12, tokens=197)
# conf/experiment/quickstart.yaml: 16 px digits, patch 4 -> 16 patches + CLS.
QUICKSTART = ModelSpec("quickstart", "quickstart net", 16, width=96, depth=12, tokens=17)
_TINY_TOKENS = (32 // h.TINY_PATCH) ** 2 + 1
TINY = ModelSpec(
    "tiny", "tiny ViT", 32, width=h.TINY_ARCH["embed_dim"], depth=h.TINY_ARCH["depth"], tokens=_TINY_TOKENS
)
QUICKSTART_TINY = ModelSpec(
    "quickstart",
    "quickstart net (tiny)",
    16,
    width=h.TINY_ARCH["embed_dim"],
    depth=h.TINY_ARCH["depth"],
    tokens=17,
    arch=h.TINY_ARCH,
)


@dataclass(frozen=True)
class Profile:
    """Every size of one benchmark mode (``default``, ``quick`` or ``smoke``); ``--images``, ``--repeats`` and
    ``--epochs`` override their fields."""

    name: str
    vit: ModelSpec  # rows 1a, 2, 5.1, 5.3 and 6
    vit_images: int  # rows 1a and 2
    vit_batch: int
    quickstart: ModelSpec  # rows 1b, 5.2 and 5.4, on the quickstart analysis images
    quickstart_images: int | None  # kept for row 1b (None: all 200)
    quickstart_batch: int | None  # rows 1b and 3 (None: the configured analysis batch size)
    quickstart_min_repeats: int  # row 1b's forward is short and noisy
    scaling_model: ModelSpec  # row 3
    scaling: tuple[int, ...]  # image counts of row 3 (the slope runs from the smallest to the largest)
    repeats: int  # interleaved repeats of rows 1 and 6
    # rows 7.1-7.2 resolve a few percent, so more than `repeats`; a streaming pass is cheaper than an observation
    groups_repeats: int
    epochs: int  # row 4
    training_overrides: tuple[str, ...]  # Hydra overrides of row 4 on top of the quickstart experiment
    renders: int  # figure renders per network in rows 5.3-5.4
    gpu_images: int
    gpu_batch: int
    fresh_memory_processes: bool  # one process per memory measurement (False: all in one; numbers then unclean)
    spectral_args: tuple[str, ...]  # of benchmarks/spectral_bench.py
    # torch threads of this process and, through OMP_NUM_THREADS, of its children (None: torch's choice)
    threads: int | None = None
    # row 8.4 also times one summary of each with the noise caches cleared (seconds at small widths)
    probe_cold: bool = True
    figures: tuple[str, ...] | None = None  # what rows 5.3-5.4 draw (FIGURE_SWITCHES; None: the library's defaults)
    memory_in_process: bool = False  # no memory child at all (--smoke: nothing measured)


DEFAULT = Profile(
    name="default",
    vit=VIT_SMALL,
    vit_images=64,
    vit_batch=32,
    quickstart=QUICKSTART,
    quickstart_images=None,
    quickstart_batch=None,
    quickstart_min_repeats=3,
    scaling_model=QUICKSTART,
    scaling=(64, 256, 1000),
    repeats=3,
    groups_repeats=5,
    epochs=2,
    training_overrides=(),
    renders=3,
    gpu_images=1000,
    gpu_batch=128,
    fresh_memory_processes=True,
    spectral_args=(),
)
QUICK = dataclasses.replace(
    DEFAULT, name="quick", vit_images=32, repeats=2, groups_repeats=4, epochs=1, renders=2, spectral_args=("--quick",)
)
SMOKE = Profile(  # at least G = 10 images wherever the default jackknife groups run (more are refused)
    name="smoke",
    vit=TINY,
    vit_images=10,
    vit_batch=4,
    quickstart=QUICKSTART_TINY,
    quickstart_images=10,
    quickstart_batch=4,
    quickstart_min_repeats=1,
    scaling_model=TINY,
    scaling=(10, 12),
    repeats=1,
    groups_repeats=1,
    epochs=1,
    training_overrides=(
        "experiment=smoke",
        f"model.arch.depth={h.TINY_ARCH['depth']}",
        "data.analysis.per_class=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        *(f"observation.figures.{name}=false" for name in FIGURE_SWITCHES),  # rendered on a thread: rows 5 time them
    ),
    renders=1,
    gpu_images=10,
    gpu_batch=4,
    fresh_memory_processes=False,
    spectral_args=("--smoke",),
    # One thread: the smoke's operations are tiny, and on a loaded 2-core machine every OpenMP barrier of a 2-thread
    # pool waits for a descheduled thread (measured: the tiny forward of 8 images took 0.30 s with 2 threads at load
    # average 3, 0.005 s with 1).
    threads=1,
    probe_cold=False,
    figures=SMOKE_FIGURES,
    memory_in_process=True,
)


# ---------------------------------------------------------------------------------------------------- rows 1, 2, 5a
def overhead(
    table: Table,
    label: str,
    row: str,
    net: torch.nn.Module,
    dataset: Any,
    batch: int,
    device: torch.device,
    repeats: int,
    work: Path,
    *,
    naive: bool,
    compare_groups: bool = False,
) -> dict[str, Any]:
    """Observation / forward for both Gram dtypes (and the naive baseline, hooks-only), interleaved with forwards.

    Both observations run the default settings (G = `_harness.default_groups` jackknife groups). With
    ``compare_groups`` a third one, float64 with ``groups=0`` (`NO_GROUPS`), is interleaved right after the float64
    one, every call's all-reduce bytes are counted, and the reduced accumulators of the last G and G = 0 runs are
    kept for rows 7 (``"jackknife"`` in the result; drop ``"accumulators"`` before writing JSON). The warm-up runs
    see every shape first, so the noise-baseline cache is warm in every timed run.
    """
    from tgo.observatory import vit_points

    points = vit_points(net)
    groups = h.default_groups()
    names = ("float64", NO_GROUPS, "float32") if compare_groups else ("float64", "float32")
    settings = {name: h.observation_settings(name) for name in ("float64", "float32")}
    settings[NO_GROUPS] = h.observation_settings("float64", groups=0)
    timers = {name: h.PhaseTimer(keep_accumulators=compare_groups and name != "float32") for name in names}
    counters = {name: h.SumCounter() for name in names}
    last: dict[str, Any] = {}

    def observe(name: str) -> None:
        counters[name].reset()
        with timers[name].attached():
            last[name] = h.observation(net, dataset, points, batch, device, settings[name], work, counters[name])
        h.synchronize(device)

    variants: dict[str, Any] = {name: functools.partial(observe, name) for name in names}
    variants["hooks only"] = lambda: h.hooked_noop_forward(net, dataset, points, batch, device)
    if naive:
        variants["naive"] = lambda: (h.naive_observation(net, dataset, points, batch, device), h.synchronize(device))
    baseline = lambda: h.plain_forward(net, dataset, batch, device)
    if h.MEASURING:  # warm-up (also of the noise-baseline cache), then one of each (timers reset: only timed runs)
        baseline()
        for fn in variants.values():
            fn()
    for timer in timers.values():
        timer.reset()
    res = h.interleaved(baseline, variants, repeats, warmup=False)
    n = len(dataset)
    forward = res["baseline"]["median_s"]
    where = f"{n} images, batch {batch}, {device.type}"
    table.add(
        f"{row}.0", f"{label}: plain inference forward", forward, "s", f"{where}; {forward / n * 1e3:.1f} ms/image"
    )
    for name in ("float64", "float32"):
        ratio = res[name]["ratio"]
        goal = f"; goal <= {GOAL:.2f}x {'met' if ratio <= GOAL else 'MISSED'}" if device.type == "cpu" else ""
        table.add(
            f"{row}.{1 if name == 'float64' else 2}",
            f"{label}: observation / forward, Gram {name}",
            ratio,
            "x",
            f"G={groups}; observation {res[name]['median_s']:.2f} s{goal}",
            ratios=res[name]["ratios"],
        )
    phases = {name: timer.medians() for name, timer in timers.items()}
    table.add(
        f"{row}.3",
        f"{label}: hooks only (no accumulation) / forward",
        res["hooks only"]["ratio"],
        "x",
        f"{len(points)} hooks + exact-fp32 context, updates do nothing",
    )
    for name in ("float64", "float32"):
        ph = phases[name]
        fixed = ph.get("reduce", 0) + ph.get("eig_observables", 0) + ph.get("records", 0)
        table.add(
            f"{row}.{4 if name == 'float64' else 5}",
            f"{label}: stream (fwd+hooks+Gram) / forward, {name}",
            ph["stream"] / forward,
            "x",
            f"G={groups}; then per observation: reduce {ph.get('reduce', 0):.3f} s, eig+observables "
            f"{ph.get('eig_observables', 0):.3f} s ({groups + 1 if groups else 1} spectra/point, noise cache warm), "
            f"records {ph.get('records', 0):.3f} s (= {fixed / forward:.3f}x)",
            phases=ph,
        )
    if naive:
        table.add(
            "2.1",
            f"{label}: naive store + torch.cov / forward",
            res["naive"]["ratio"],
            "x",
            f"naive {res['naive']['median_s']:.2f} s; naive / ours (f64, G={groups}) = "
            f"{res['naive']['median_s'] / res['float64']['median_s']:.2f}x",
            ratios=res["naive"]["ratios"],
        )
    out: dict[str, Any] = {
        "groups": groups,
        "timings": {k: dict(v) for k, v in res.items()},
        "phases": phases,
        "results": last.get("float64"),
    }
    if compare_groups:
        out["jackknife"] = _groups_comparison(res, timers, counters, groups)
    return out


def _groups_comparison(
    res: dict[str, Any], timers: dict[str, h.PhaseTimer], counters: dict[str, h.SumCounter], groups: int
) -> dict[str, Any]:
    """G against G = 0 from the interleaved runs of `overhead`: paired ratios, all-reduce bytes, accumulators.

    Each run is first divided by the mean of the two plain forwards around it (as every ratio of the table), then
    the G run of a repeat is divided by the G = 0 run of the same repeat (they are neighbours in the interleaving).
    """

    def around(name: str) -> list[float]:
        return [run / ratio for run, ratio in zip(res[name]["runs"], res[name]["ratios"], strict=True)]

    stream_g, stream_0 = timers["float64"].samples["stream"], timers[NO_GROUPS].samples["stream"]
    stream_pairs = [
        (a / fa) / (b / fb)
        for a, fa, b, fb in zip(stream_g, around("float64"), stream_0, around(NO_GROUPS), strict=True)
    ]
    observation_pairs = [a / b for a, b in zip(res["float64"]["ratios"], res[NO_GROUPS]["ratios"], strict=True)]
    return {
        "groups": groups,
        "stream_ratio_in_observation": statistics.median(stream_pairs),
        "stream_ratios_in_observation": stream_pairs,
        "stream_s": {"grouped": statistics.median(stream_g), "off": statistics.median(stream_0)},
        "observation_ratio": statistics.median(observation_pairs),
        "observation_ratios": observation_pairs,
        "observation_s": {"grouped": res["float64"]["median_s"], "off": res[NO_GROUPS]["median_s"]},
        "phases": {"grouped": timers["float64"].medians(), "off": timers[NO_GROUPS].medians()},
        "allreduce_bytes": {"grouped": counters["float64"].calls, "off": counters[NO_GROUPS].calls},
        "accumulators": {"grouped": timers["float64"].accumulators, "off": timers[NO_GROUPS].accumulators},
    }


# ---------------------------------------------------------------------------------------------------- rows 2, 3
VARIANTS = ("forward", "ours", "naive")


def state_mb(spec: ModelSpec, groups: int) -> float:
    """Accumulator state of one observation of ``spec`` by construction: points x max(G, 1) x (2 + D + D^2) x 8 B."""
    d = spec.width
    return spec.points * max(groups, 1) * (2 + d + d * d) * 8 / MB


def _memory_spec(spec: ModelSpec, images: int, batch: int, variant: str) -> tuple[str, ...]:
    """The memory child's ``MODEL SIZE IMAGES BATCH VARIANT``."""
    return (spec.kind, str(spec.image_size), str(images), str(batch), variant)


def memory_rows(
    table: Table, profile: Profile, vit_images: int, qs_batch: int, *, compare_groups: bool = False
) -> dict[str, Any]:
    """Peak RSS above the loaded model, one fresh process per variant (see `_harness.run_memory_children`).

    "ours" runs the default settings (G jackknife groups); with ``compare_groups`` the vit network is also measured
    with ``groups=0`` (row 7.5).
    """
    vit, small = profile.vit, profile.scaling_model
    variants = (*VARIANTS, "ours_g0") if compare_groups else VARIANTS
    scaled = [(n, v) for n in profile.scaling for v in ("ours", "naive")]
    specs = [_memory_spec(vit, vit_images, profile.vit_batch, v) for v in variants]
    specs += [_memory_spec(small, n, qs_batch, v) for n, v in scaled]
    measured = h.run_memory_children(specs, fresh=profile.fresh_memory_processes, in_process=profile.memory_in_process)
    peaks = dict(zip(variants, measured[: len(variants)], strict=False))
    raw: dict[str, Any] = {vit.kind: peaks, "quickstart_scaling": measured[len(variants) :]}
    mb = {v: p["peak_delta_bytes"] / MB for v, p in peaks.items()}
    _peak_rows(table, vit, vit_images, mb, peaks["ours"]["method"])
    scale: dict[str, dict[int, float]] = {"ours": {}, "naive": {}}
    for (n, v), res in zip(scaled, measured[len(variants) :], strict=False):
        scale[v][n] = res["peak_delta_bytes"] / MB
    _scaling_rows(table, small, profile.scaling, scale)
    if compare_groups:
        groups = h.default_groups()
        table.add(
            "7.5",
            f"{vit.label}, {vit_images} images: peak RSS, G={groups} / G=0",
            mb["ours"],
            "MB",
            f"= {mb['ours'] / max(mb['ours_g0'], 1e-9):.2f}x; f64 observe_and_record, fresh process each (noise "
            f"cache cold there); state by construction {state_mb(vit, groups):.1f} / {state_mb(vit, 0):.1f} MB",
            text=f"{mb['ours']:.1f} / {mb['ours_g0']:.1f} MB",
            peaks_mb={"grouped": mb["ours"], "off": mb["ours_g0"]},
        )
    return raw


def _peak_rows(table: Table, spec: ModelSpec, images: int, mb: dict[str, float], method: str) -> None:
    """Rows 2.2-2.4: the peaks of forward, ours and naive on one network."""
    p, w, groups = spec.points, spec.width, h.default_groups()
    where = f"{spec.label}, {images} images: peak RSS"
    table.add("2.2", f"{where}, plain forward", mb["forward"], "MB", "the floor: one batch's activations")
    table.add(
        "2.3",
        f"{where}, ours (f64)",
        mb["ours"],
        "MB",
        f"G={groups}; state held: {p} x {max(groups, 1)} x ({w}^2+{w}+2) x 8 B = {state_mb(spec, groups):.1f} MB",
    )
    table.add(
        "2.4",
        f"{where}, naive",
        mb["naive"],
        "MB",
        f"naive / ours = {mb['naive'] / max(mb['ours'], 1e-9):.1f}x; method: {method}",
    )


def _scaling_rows(table: Table, spec: ModelSpec, scaling: Sequence[int], scale: dict[str, dict[int, float]]) -> None:
    """Rows 3.1-3.3: MB per image of ours and naive (slope of the peak), and what naive holds by construction."""
    lo, hi = min(scaling), max(scaling)
    for v in ("ours", "naive"):
        per_image = (scale[v][hi] - scale[v][lo]) / (hi - lo)
        series = ", ".join(f"{n}: {scale[v][n]:.1f}" for n in scaling)
        table.add(
            f"3.{1 if v == 'ours' else 2}",
            f"{spec.label}, peak RSS MB/image, {v}",
            per_image,
            "MB/img",
            f"{f'G={h.default_groups()}; ' if v == 'ours' else ''}peak MB at {series} images (slope {lo}->{hi})",
            peaks_mb=scale[v],
        )
    p, t, w = spec.points, spec.tokens, spec.width
    table.add(
        "3.3",
        f"{spec.name}: naive bytes held by construction",
        p * t * w * 4 / MB,
        "MB/img",
        f"{p} points x {t} tokens x {w} floats x 4 B; ours (G={h.default_groups()}) holds "
        f"{state_mb(spec, h.default_groups()):.1f} MB whatever the count",
    )


# ---------------------------------------------------------------------------------------------------- row 4
class EpochTimer(L.Callback):
    """Wall-clock stamps at every train epoch start and at train end (kept on the class: Hydra builds the instance)."""

    stamps: list[tuple[str, int, float]] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        EpochTimer.stamps.append(("epoch_start", trainer.current_epoch, time.perf_counter()))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        EpochTimer.stamps.append(("train_end", trainer.current_epoch, time.perf_counter()))


def training_overhead(table: Table, epochs: int, work: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Quickstart for ``epochs`` full epochs with an observation after every epoch; observing time / epoch time."""
    from tgo.callbacks.spectral_geometry import SpectralGeometryCallback
    from tgo.train import run

    calls: list[dict[str, float]] = []

    def wrap(_: str, original: Any) -> Any:
        def timed_observe(self: Any, trainer: Any, pl_module: Any, epoch: int) -> None:
            start = time.perf_counter()
            original(self, trainer, pl_module, epoch)
            seconds, logging = time.perf_counter() - start, self.last_logging_seconds or 0.0
            calls.append(
                {"epoch": epoch, "seconds": seconds, "pass": self.last_pass_seconds or 0.0, "logging": logging}
            )

        return timed_observe

    EpochTimer.stamps = []
    run_dir = work / "quickstart_run"
    cfg = h.compose_quickstart(
        run_dir,
        [
            *overrides,
            "observation.every_n_epochs=1",
            f"trainer.max_epochs={epochs}",
            "trainer.enable_progress_bar=false",
            f"+callbacks.bench_epoch_timer._target_={EpochTimer.__module__}.{EpochTimer.__qualname__}",
        ],
    )
    with h.patched({"observe": (SpectralGeometryCallback, "observe_epoch")}, wrap):
        run(cfg)
    return _training_rows(table, calls, int(cfg.observation.groups))


def _training_rows(table: Table, calls: list[dict[str, float]], groups: int) -> dict[str, Any]:
    """Rows 4.1-4.3 from the epoch stamps and the timed observations."""
    starts = [t for kind, _, t in EpochTimer.stamps if kind == "epoch_start"]
    end = [t for kind, _, t in EpochTimer.stamps if kind == "train_end"][-1]
    bounds = [*starts, end]
    by_epoch = {c["epoch"]: c for c in calls}
    per_epoch = []
    for e in range(len(starts)):
        wall = bounds[e + 1] - bounds[e]
        obs = by_epoch.get(e + 1, {"seconds": 0.0, "pass": 0.0, "logging": 0.0})
        per_epoch.append(
            {
                "epoch": e + 1,
                "wall_s": wall,
                "observe_s": obs["seconds"],
                "pass_s": obs["pass"],
                "figures_s": obs["logging"],
            }
        )
    frac = statistics.median(p["observe_s"] / p["wall_s"] for p in per_epoch)
    frac_pass = statistics.median(p["pass_s"] / p["wall_s"] for p in per_epoch)
    wall = statistics.median(p["wall_s"] for p in per_epoch)
    obs_s = statistics.median(p["observe_s"] for p in per_epoch)
    table.add(
        "4.1",
        "quickstart, every_n_epochs=1: observing / epoch wall time",
        100 * frac,
        "%",
        f"G={groups}; median of {len(per_epoch)} epochs: epoch {wall:.2f} s (train+val+observe+checkpoints), "
        f"observation {obs_s:.2f} s incl. scalars and the figure hand-off (figures render in background)",
    )
    table.add(
        "4.2",
        "quickstart: observation pass only (no figures) / epoch",
        100 * frac_pass,
        "%",
        f"G={groups}; pass {statistics.median(p['pass_s'] for p in per_epoch):.2f} s, scalars + figure hand-off "
        f"{statistics.median(p['figures_s'] for p in per_epoch):.2f} s; epoch-0 observation "
        f"{by_epoch.get(0, {}).get('seconds', float('nan')):.2f} s (a shape's first observation also computes "
        f"its noise baselines; later epochs reuse them)",
    )
    # Epoch 0 pays the cold noise baselines in its pass, which would flatter the ratio: the later epochs, if any.
    warm = [c for c in calls if c["epoch"] > 0 and c["pass"] > 0] or [c for c in calls if c["pass"] > 0]
    ratios = [c["seconds"] / c["pass"] for c in warm]
    table.add(
        "4.3",
        "quickstart: callback blocking time / observation pass",
        statistics.median(ratios) if ratios else math.nan,
        "x",
        f"target <= {BLOCKING_TARGET:.2f}x; median of {len(ratios)} observations after epoch 0 (worst "
        f"{max(ratios, default=math.nan):.3f}x): blocking {statistics.median(c['seconds'] for c in warm):.2f} s "
        f"(pass + scalars + figure hand-off; the figures render on a background thread) vs pass "
        f"{statistics.median(c['pass'] for c in warm):.2f} s",
    )
    return {"groups": groups, "per_epoch": per_epoch, "observations": calls}


# ---------------------------------------------------------------------------------------------------- row 5
def figure_time(results: Any, renders: int, work: Path, figures: Sequence[str] | None = None) -> float:
    """Median seconds of the callback's figures (`tgo.callbacks.dashboard.draw_figures`) for one observation
    (history growing per render).

    The callback draws from the run's records, so each render is preceded (untimed, as in training where it belongs
    to the pass) by recording the observation under the next epoch: the history grows by one per render. ``figures``
    names the kinds drawn, every other one off (``None``: the library's default kinds).
    """
    from torch.utils.tensorboard import SummaryWriter

    from tgo.callbacks.dashboard import draw_figures
    from tgo.observatory.standalone import observation_settings
    from tgo.records import RecordWriter, RunDir

    settings: dict[str, Any] = {"every_n_epochs": 1}
    if figures is not None:
        settings["figures"] = {name: name in figures for name in FIGURE_SWITCHES}
    drawn = observation_settings(settings, {}).figures
    run = RunDir(tempfile.mkdtemp(dir=work))
    records = RecordWriter(run)
    writer = SummaryWriter(str(run.tensorboard))
    samples = []
    try:
        for epoch in range(renders):
            records.write_observation(epoch, epoch, results, with_covariance=False)
            start = time.perf_counter()
            draw_figures(writer, run.root, epoch, results, list(range(epoch + 1)), drawn)  # the epochs recorded so far
            writer.flush()
            samples.append(time.perf_counter() - start)
    finally:
        writer.close()
    return statistics.median(samples)


def eig_and_figure_rows(
    table: Table, profile: Profile, results: dict[str, Any], observed: dict[str, Any], skip: set[str], work: Path
) -> None:
    """Rows 5.1-5.4: the eigendecomposition phase of rows 1a/1b, and TensorBoard figures per observation."""
    from tgo.spectral import CATALOGUE

    observables = len(CATALOGUE) - len(CATALOGUE.diagnostics)  # per point, the diagnostics left out
    for row, section, spec in (("5.1", "vit_small", profile.vit), ("5.2", "quickstart", profile.quickstart)):
        if section in results:
            eig = results[section]["phases"]["float64"]["eig_observables"]
            groups = results[section]["groups"]
            source = "1a" if section == "vit_small" else "1b"
            spectra = f"{groups + 1} spectra/point (total + {groups} leave-one-group-out)" if groups else "1 spectrum"
            table.add(
                row,
                f"eigendecomposition + observables, {spec.points} x {spec.width}^2 f64",
                eig,
                "s",
                f"G={groups}: {spectra}, numpy eigvalsh (1 BLAS thread), {observables} observables each, "
                f"noise cache warm; from rows {source}",
            )
    if "figures" in skip:
        return
    for row, section, spec in (("5.3", "vit_small", profile.vit), ("5.4", "quickstart", profile.quickstart)):
        if observed.get(section) is not None:
            seconds = figure_time(observed[section], profile.renders, work, profile.figures)
            kinds = (
                "the default kinds (depth profiles, against-epoch bands, histograms; no story function)"
                if profile.figures is None
                else f"only {', '.join(profile.figures)}"
            )
            table.add(
                row,
                f"TensorBoard figures per observation, {spec.points} x {spec.width}",
                seconds,
                "s",
                f"{kinds}; "
                f"median of {profile.renders}; drawn from the G={results[section]['groups']} observation of rows "
                f"{'1a' if section == 'vit_small' else '1b'}",
            )


# ---------------------------------------------------------------------------------------------------- row 6
def _ddp_worker(rank: int, world: int, port: int, spec: ModelSpec, images: int, batch: int, out: str) -> None:
    """One rank of row 6.4: ``observe_and_record`` over this rank's shard with a real NCCL sum (rank 0 writes JSON)."""
    import torch.distributed as dist

    from tgo.observatory import RecordPlan, ShardPlan, observe_and_record, vit_points
    from tgo.records import RecordWriter

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    device = torch.device("cuda", rank)
    try:
        net = spec.build(device)
        dataset = h.random_images(images, spec.image_size)
        points = vit_points(net)
        settings = h.observation_settings("float64")

        def reduce_sum(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t)
            return t

        samples = []
        for i in range(3):  # one warm-up, two timed
            dist.barrier()
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            observe_and_record(
                net,
                dataset,
                points,
                settings=settings,
                plan=ShardPlan(rank=rank, world_size=world, batch_size=batch),
                record=RecordPlan(writer=RecordWriter(Path(out).parent / f"ddp_{i}"), epoch=0, step=0),
                all_reduce_sum=reduce_sum,
                is_global_zero=rank == 0,
                device=device,
            )
            torch.cuda.synchronize(device)
            dist.barrier()
            if i:
                samples.append(time.perf_counter() - start)
        if rank == 0:
            Path(out).write_text(json.dumps({"world_size": world, "seconds": samples}), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def gpu_rows(table: Table, profile: Profile, repeats: int, work: Path) -> dict[str, Any]:
    """Row 6: the same measurements on the GPU (vit_small at 224 px, 1,000 images), peak memory and DDP."""
    if not torch.cuda.is_available():
        table.skip(GPU_ROWS, "GPU rows", "no GPU", "torch.cuda.is_available() is False", shown_as="6")
        return {"skipped": "no GPU"}
    import torch.multiprocessing as mp

    from tgo.observatory import vit_points

    device = torch.device("cuda", 0)
    spec, images, batch = profile.vit, profile.gpu_images, profile.gpu_batch
    net = spec.build(device)
    dataset = h.random_images(images, spec.image_size)
    world = torch.cuda.device_count()
    table.add("6.0", "GPU", world, "", f"{world} device(s)", text=torch.cuda.get_device_name(0))
    res = overhead(table, f"GPU {spec.label}", "6.1", net, dataset, batch, device, repeats, work, naive=False)
    res.pop("results")
    raw: dict[str, Any] = {"overhead": res}
    f64, f32 = res["timings"]["float64"]["median_s"], res["timings"]["float32"]["median_s"]
    detail = f"G={res['groups']}; float32 Gram {f32:.2f} s"
    table.add("6.2", f"GPU: tgo1 observation of {images} images (f64), wall time", f64, "s", detail)
    # Row 6.3: peak GPU memory above the model of forward, ours and naive (one run each).
    points, settings = vit_points(net), h.observation_settings("float64")
    mem = raw["memory"] = {}
    for name, fn in (
        ("forward", lambda: h.plain_forward(net, dataset, batch, device)),
        ("ours", lambda: h.observation(net, dataset, points, batch, device, settings, work)),
        ("naive", lambda: h.naive_observation(net, dataset, points, batch, device)),
    ):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        mem[name] = {
            "peak_mb": (torch.cuda.max_memory_allocated(device) - base) / MB,
            "seconds": time.perf_counter() - start,
        }
    table.add(
        "6.3",
        f"GPU peak memory above model, {images} images: forward / ours / naive",
        mem["ours"]["peak_mb"],
        "MB",
        f"ours: G={settings.groups}; naive / forward time {mem['naive']['seconds'] / mem['forward']['seconds']:.2f}x "
        f"(single run)",
        text=f"{mem['forward']['peak_mb']:.0f} / {mem['ours']['peak_mb']:.0f} / {mem['naive']['peak_mb']:.0f} MB",
        peaks_mb={k: v["peak_mb"] for k, v in mem.items()},
    )
    # Row 6.4: the analysis pass under DDP over every GPU present (NCCL, one process per GPU).
    out = work / "ddp.json"
    mp.spawn(_ddp_worker, args=(world, h.free_port(), spec, images, batch, str(out)), nprocs=world, join=True)
    ddp = raw["ddp"] = json.loads(out.read_text(encoding="utf-8"))
    table.add(
        "6.4",
        f"GPU DDP analysis pass over {world} GPU(s), {images} images (f64)",
        statistics.median(ddp["seconds"]),
        "s",
        f"G={h.default_groups()}; NCCL; every image once; two sum all-reduces",
    )
    return raw


# ---------------------------------------------------------------------------------------------------- row 7
def state_bytes(accumulators: Mapping[str, Any]) -> dict[str, Any]:
    """Packed state (the second collective's tensor) per point and in total, from ``packed_size`` of the states as
    ``reduce_accumulators`` flattens them (each group's)."""
    from tgo.spectral import GroupedCovariance

    flat = {name: acc.groups if isinstance(acc, GroupedCovariance) else [acc] for name, acc in accumulators.items()}
    per_point = {name: 8 * sum(a.packed_size for a in states) for name, states in flat.items()}
    return {"per_point": per_point, "total": sum(per_point.values())}


def stream_comparison(
    net: torch.nn.Module, dataset: Any, batch: int, device: torch.device, repeats: int
) -> dict[str, Any]:
    """The streaming pass with G groups against the same pass with G = 0: ``G0, G, G0, G, ..., G0`` after one
    warm-up of each, each G run divided by the mean of the two G = 0 runs around it (`_harness.interleaved`)."""
    from tgo.observatory import vit_points

    points, groups = vit_points(net), h.default_groups()
    off = lambda: h.stream_pass(net, dataset, points, batch, device, 0)
    return {"groups": groups} | h.paired(
        off, lambda: h.stream_pass(net, dataset, points, batch, device, groups), repeats
    )


def jackknife_pass_rows(
    table: Table, rows: tuple[str, str], label: str, jk: dict[str, Any], stream: dict[str, Any]
) -> dict[str, Any]:
    """Rows 7.1/7.2 (streaming pass G / G = 0, from `stream_comparison`) and 7.3/7.4 (state = all-reduce bytes,
    from `_groups_comparison`).

    Returns:
        ``jk`` without the accumulators, with the state bytes and the stream comparison added (for the JSON).
    """
    groups = jk["groups"]
    accs = jk.pop("accumulators")
    jk["stream_comparison"] = stream
    ratio = stream["ratio"]
    met = "met" if ratio <= GROUPS_TARGET else "MISSED"
    table.add(
        rows[0],
        f"{label}: stream (fwd+hooks+Gram) G={groups} / G=0, f64",
        ratio,
        "x",
        f"stream {stream['on_s']:.2f} s vs {stream['off_s']:.2f} s, median of {stream['repeats']} interleaved "
        f"pairs; target <= {GROUPS_TARGET:.2f}x {met}; whole observation G={groups} / G=0 = "
        f"{jk['observation_ratio']:.2f}x ({jk['observation_s']['grouped']:.2f} s vs "
        f"{jk['observation_s']['off']:.2f} s)",
        ratios=stream["ratios"],
    )
    state = {k: state_bytes(v) for k, v in accs.items() if v is not None}
    sent = {k: sum(v) for k, v in jk["allreduce_bytes"].items()}
    jk["state_bytes"] = state
    if len(state) == 2:
        per_point = {k: max(v["per_point"].values()) for k, v in state.items()}
        dim = max(a.dim for a in accs["off"].values())
        reduce = {k: v.get("reduce", math.nan) for k, v in jk["phases"].items()}
        table.add(
            rows[1],
            f"{label}: all-reduce bytes per observation, G={groups} / G=0",
            sent["grouped"] / MB,
            "MB",
            f"= {sent['grouped'] / max(sent['off'], 1):.1f}x; packed state per point {per_point['grouped'] / MB:.2f} / "
            f"{per_point['off'] / MB:.3f} MB (G x (2+{dim}+{dim}^2) x 8 B), {len(accs['off'])} points "
            f"{state['grouped']['total'] / MB:.1f} / {state['off']['total'] / MB:.2f} MB, the rest shift agreement; "
            f"2 collectives each; reduce phase (identity sum) {reduce['grouped']:.3f} / {reduce['off']:.3f} s",
            text=f"{sent['grouped'] / MB:.1f} / {sent['off'] / MB:.2f} MB",
            bytes=sent,
        )
    return jk


def jackknife_summary_row(table: Table, row: str, spec: ModelSpec, grouped: Any, off: Any, repeats: int) -> dict:
    """Rows 7.6/7.7: rank 0's ``summarize_accumulators`` (eigendecomposition + observables + jackknife) for the same
    observation with G groups and with G = 0.

    Warm: the noise-baseline cache already holds every shape (the observations of rows 1a/1b computed them; one
    untimed call of each makes sure), G = 0 and G interleaved, median of ``repeats``. Cold: the cache cleared before
    one call of each (G = 0 first, so every shape is cached again afterwards and later rows are not affected).
    """
    from tgo.observatory import summarize_accumulators

    groups, fit_range = h.default_groups(), h.observation_settings().fit_range
    variants = {
        name: (lambda a=accs: summarize_accumulators(a, nan_if_nonfinite=True, fit_range=fit_range))
        for name, accs in (("off", off), ("grouped", grouped))
    }
    raw = h.alternated(variants, repeats, cold=True)
    del raw["last"]
    warm, cold = raw["warm_s"], raw["cold_s"]
    if cold:
        cold_text = (
            f"cold (noise cache cleared): {cold['grouped']:.2f} / {cold['off']:.2f} s, i.e. first call per shape "
            f"+{cold['grouped'] - warm['grouped']:.2f} / +{cold['off'] - warm['off']:.2f} s"
        )
    else:
        cold_text = "cold not measured (no noise-baseline cache found to clear)"
    table.add(
        row,
        f"rank-0 summary, {spec.points} x {spec.width}^2 f64, G={groups} / G=0",
        warm["grouped"],
        "s",
        f"= {warm['grouped'] / max(warm['off'], 1e-12):.1f}x; {groups + 1} / 1 spectra+observables per point, noise "
        f"cache warm, median of {max(repeats, 1)}; {cold_text}",
        text=f"{warm['grouped']:.3f} / {warm['off']:.3f} s",
    )
    return raw


# ---------------------------------------------------------------------------------------------------- row 8
def probe_pass(net: torch.nn.Module, dataset: Any, batch: int, device: torch.device, repeats: int) -> dict[str, Any]:
    """The streaming pass with the probes' per-image vectors against the same pass without, default groups.

    ``off, on, off, on, ..., off`` after one warm-up of each, each probes run divided by the mean of the two runs
    without around it (`_harness.interleaved`). Then one more probes run, untimed for the ratio, split by
    `_harness.timed_calls` into the hooks' accumulator updates and, inside them, the per-image vectors.

    Returns:
        Timings, the split, and under ``"last"`` the accumulators of the last run of each (``"on"`` with its
        ``ImageTable``), not reduced; drop ``"last"`` before writing JSON.
    """
    from tgo.observatory import vit_points
    from tgo.observatory.families import IMAGE_VECTORS
    from tgo.observatory.families.image_vectors import ImageTable, ImageVectors
    from tgo.observatory.stream import _LazyAccumulator

    off, on, last = h.family_pass(IMAGE_VECTORS, net, dataset, batch, device, h.observation_settings())
    res = h.paired(off, on, repeats)
    split = {  # every hook's update, and the probes' parts
        "hook_updates": (_LazyAccumulator, "update"),
        "image_vectors": (ImageVectors, "update"),
        "record_batch": (ImageTable, "record_batch"),
    }
    with h.timed_calls(split) as calls:
        start = time.perf_counter()
        on()
        split_total = time.perf_counter() - start
    return {
        "groups": h.default_groups(),
        "repeats": repeats,
        "images": len(dataset),
        "points": len(vit_points(net)),
        **res,
        "split": {
            "pass_s": split_total,
            **{f"{name}_s": sum(v) for name, v in calls.items()},
            **{f"{name}_calls": len(v) for name, v in calls.items()},
        },
        "last": last,
    }


def probe_pass_row(table: Table, row: str, label: str, raw: dict[str, Any]) -> None:
    """Rows 8.1/8.2 from `probe_pass`."""
    ratio, split = raw["ratio"], raw["split"]
    met = "met" if ratio <= PROBES_TARGET else "MISSED"
    table.add(
        row,
        f"{label}: stream (fwd+hooks+Gram) probes on / off, f64",
        ratio,
        "x",
        f"G={raw['groups']}; stream {raw['on_s']:.2f} s vs {raw['off_s']:.2f} s, median of {raw['repeats']} "
        f"interleaved pairs; target <= {PROBES_TARGET:.2f}x {met}; in one more probes pass of "
        f"{split['pass_s']:.2f} s: hook updates {split['hook_updates_s']:.3f} s, of which per-image vectors "
        f"{split['image_vectors_s']:.3f} s ({split['image_vectors_calls']} updates), record_batch "
        f"{split['record_batch_s']:.4f} s",
        ratios=raw["ratios"],
    )


def image_table_bytes(images: Any, n_images: int) -> int:
    """Bytes of ``images`` (an ``ImageTable``) packed, as it would be for ``n_images`` images (same points, ranks).

    ``ImageTable.packed_size`` x 8 with the image count replaced: 2 x n (visits, labels) + per point
    W x (1 + D) (rows per image, ``max |x|``) + kinds x n x D.
    """
    size = 2 * n_images
    for vectors in images.points.values():
        size += vectors.world_size * (1 + vectors.dim) + len(vectors.values) * n_images * vectors.dim
    return 8 * size


def probe_state_row(table: Table, row: str, spec: ModelSpec, raw: dict[str, Any]) -> dict[str, Any]:
    """Row 8.3: the image table's bytes per observation (measured and at 1,000 images) against the covariance state,
    and the all-reduce bytes with and without the probes (the last runs of `probe_pass`, reduced here in place with
    a counting identity sum, so rows 8.4-8.5 summarise reduced accumulators)."""
    from tgo.observatory.stream import reduce_accumulators

    accs_on, run = raw["last"]["on"]
    images = run.state.table
    accs_off = raw["last"]["off"]
    counters = {"on": h.SumCounter(), "off": h.SumCounter()}
    start = time.perf_counter()
    reduce_accumulators(accs_on, counters["on"], run.state.summables())
    reduce_on = time.perf_counter() - start
    run.state.check()
    start = time.perf_counter()
    reduce_accumulators(accs_off, counters["off"])
    reduce_off = time.perf_counter() - start
    del raw["last"]["off"], accs_off  # only its bytes were needed; rows 8.4-8.5 use the probes run's accumulators
    n = images.n_images
    kinds = sum(len(v.values) for v in images.points.values())
    dims = sorted({v.dim for v in images.points.values()})
    table_b = 8 * images.packed_size
    table_1k = image_table_bytes(images, EXTRAPOLATED_IMAGES)
    cov_b = state_bytes(accs_on)["total"]
    sent = {k: sum(c.calls) for k, c in counters.items()}
    out = {
        "images": n,
        "image_table_bytes": table_b,
        f"image_table_bytes_{EXTRAPOLATED_IMAGES}": table_1k,
        "vector_kinds": kinds,
        "covariance_state_bytes": cov_b,
        "allreduce_bytes": sent,
        "allreduce_calls": {k: c.calls for k, c in counters.items()},
        "reduce_s": {"on": reduce_on, "off": reduce_off},
    }
    table.add(
        row,
        f"{spec.label}: image table per observation, {n} / {EXTRAPOLATED_IMAGES:,} images",
        table_b / MB,
        "MB",
        f"{len(images.points)} points, {kinds} vectors of D={'/'.join(map(str, dims))} per image (mean, cls, patch) "
        f"x 8 B; covariance state (G={h.default_groups()}) {cov_b / MB:.1f} MB, so the table is "
        f"{table_b / max(cov_b, 1):.2f}x of it here and {table_1k / max(cov_b, 1):.2f}x at {EXTRAPOLATED_IMAGES:,} "
        f"images; all-reduce bytes probes on / off {sent['on'] / MB:.2f} / {sent['off'] / MB:.2f} MB "
        f"({len(counters['on'].calls)} / {len(counters['off'].calls)} collectives), reduce (identity sum) "
        f"{reduce_on:.3f} / {reduce_off:.3f} s; held once per rank and once in the reduction buffer",
        text=f"{table_b / MB:.2f} / {table_1k / MB:.1f} MB",
        bytes=out,
    )
    return out


def probe_summary_row(
    table: Table, row: str, spec: ModelSpec, raw: dict[str, Any], dataset: Any, repeats: int, *, cold: bool = True
) -> dict[str, Any]:
    """Row 8.4: rank 0's ``summarize_accumulators`` with the probes (image table, image groups, probe settings, a
    subspace history) against without, on the same reduced accumulators (row 8.3's probes run).

    Warm: one untimed call of each first (it also fills the noise cache for the views' shapes and gives the subspace
    history a later epoch would read from its records), then ``off, on`` ``repeats`` times, medians, and with
    ``cold`` the cold cost (`_harness.alternated`: probes last, so every shape is cached again afterwards). Then one
    probes call split by `_harness.timed_calls` (``summarize_accumulators`` summarises points in a thread pool, so
    the parts are summed over its threads and can add up to more than the call's wall time).

    Returns:
        Timings, the split, view counts, and under ``"results"`` the last ``Results`` of each (for row 8.5; drop it
        before writing JSON).
    """
    from tgo.observatory import results, summarize_accumulators
    from tgo.observatory.families import image_vectors
    from tgo.observatory.pipeline import group_of_items

    accs, run = raw["last"]["on"]
    points = list(run.context.points)
    settings = h.observation_settings()
    groups = settings.groups
    image_groups = group_of_items(dataset, groups) if groups else None

    def off() -> Any:
        return summarize_accumulators(accs, points, nan_if_nonfinite=True, fit_range=settings.fit_range)

    def on() -> Any:
        return summarize_accumulators(
            accs,
            points,
            nan_if_nonfinite=True,
            fit_range=settings.fit_range,
            families=[run],
            image_groups=image_groups,
        )

    run.history = h.subspace_history(on())
    off()
    timed = h.alternated({"off": off, "on": on}, repeats, warmup=False, cold=cold)
    med, cold_s, last = timed.pop("warm_s"), timed["cold_s"], timed.pop("last")
    names = ("point_views", "class_metrics", "drift_metrics", "massive_metrics")  # what summarize_accumulators calls
    parts = {"summarize_views": (results, "summarize_views"), **{name: (image_vectors, name) for name in names}}
    with h.timed_calls(parts) as calls:
        start = time.perf_counter()
        on()
        split_total = time.perf_counter() - start
    views = {k: len(v) for k, v in last.items()}
    split = {name: sum(v) for name, v in calls.items()}
    split_calls = {name: len(v) for name, v in calls.items()}
    spectra = groups + 1 if groups else 1
    if cold_s:
        cold_text = f"cold (noise cache cleared) {cold_s['on']:.2f} / {cold_s['off']:.2f} s"
    else:
        cold_text = "cold not measured" + (" (no noise-baseline cache found)" if cold else " in this profile")
    table.add(
        row,
        f"rank-0 summary, {spec.points} x {spec.width}^2 f64, G={groups}: probes on / off",
        med["on"],
        "s",
        f"= {med['on'] / max(med['off'], 1e-12):.1f}x; {views['on']} / {views['off']} (point, view) results, "
        f"noise cache warm, median of {max(repeats, 1)}; one probes call of {split_total:.2f} s wall, its calls summed "
        f"over the point threads: view spectra + "
        f"observables {split['summarize_views']:.2f} s ({views['on']} results, {split_calls['summarize_views']} "
        f"chunks of views x {spectra} spectra), "
        f"view moments {split['point_views']:.2f} s, class geometry + decoding "
        f"{split['class_metrics']:.2f} s ({split_calls['class_metrics']} calls), drift {split['drift_metrics']:.2f} s, "
        f"massive {split['massive_metrics']:.3f} s; {cold_text}",
        text=f"{med['on']:.3f} / {med['off']:.3f} s",
        ratio=med["on"] / max(med["off"], 1e-12),
    )
    return timed | {
        "warm_s": med,
        "views": views,
        "split_s": split,
        "split_calls": split_calls,
        "split_total_s": split_total,
        "results": last,
    }


def _npz_members(path: Path) -> dict[str, int]:
    """``{member without .npy: bytes as stored}`` of an npz file (``np.savez`` stores members uncompressed)."""
    with zipfile.ZipFile(path) as archive:
        return {info.filename.removesuffix(".npy"): info.compress_size for info in archive.infolist()}


def probe_record_row(table: Table, row: str, spec: ModelSpec, summaries: Mapping[str, Any], work: Path) -> dict:
    """Row 8.5: what a kept epoch writes for the probes: the per-image vectors (float32, the ``cls`` and ``patch``
    views of every point) in the spectra npz, measured by writing row 8.4's probes ``Results`` with
    ``with_covariance=True`` and reading the member sizes, and extrapolated to 1,000 images. The detail compares
    the whole spectra file with and without probes, at a kept epoch and at any other."""
    import numpy as np

    from tgo.records import RecordWriter

    files: dict[str, int] = {}
    members: dict[str, dict[str, int]] = {}
    shapes: dict[str, tuple[tuple[int, ...], int]] = {}
    for name, key, kept in (
        ("on_kept", "on", True),
        ("on", "on", False),
        ("off_kept", "off", True),
        ("off", "off", False),
    ):
        writer = RecordWriter(Path(tempfile.mkdtemp(dir=work)))
        writer.write_observation(0, 0, summaries[key], with_covariance=kept)
        path = writer.run.spectra(0)
        files[name] = path.stat().st_size
        members[name] = _npz_members(path)
        if name == "on_kept":
            with np.load(path) as npz:
                shapes = {k: (npz[k].shape, npz[k].dtype.itemsize) for k in npz.files if k.endswith("/vectors")}
    vectors = {k: v for k, v in members["on_kept"].items() if k.endswith("/vectors")}
    labels = sum(v for k, v in members["on_kept"].items() if k.endswith("/labels"))
    covariances = {
        k: sum(v for m, v in members[k].items() if m.endswith("/covariance")) for k in ("on_kept", "off_kept")
    }
    by_kind: dict[str, Counter[str]] = {name: Counter() for name in members}  # bytes by array name, first seen first
    for name, found in members.items():
        for member, size in found.items():
            by_kind[name][member.rsplit("/", 1)[-1]] += size
    n_images = max((s[0][0] for s in shapes.values()), default=0)
    per_image = sum(s[0][1] * s[1] for s in shapes.values())
    extrapolated = per_image * EXTRAPOLATED_IMAGES
    estimate = EXTRAPOLATED_IMAGES * spec.points * spec.width * 4
    measured = sum(vectors.values())
    out = {
        "images": n_images,
        "vector_arrays": len(vectors),
        "vector_bytes": measured,
        "label_bytes": labels,
        "bytes_per_image": per_image,
        f"vector_bytes_{EXTRAPOLATED_IMAGES}": extrapolated,
        "one_vector_per_point_estimate": estimate,
        "spectra_file_bytes": files,
        "covariance_bytes": covariances,
        "bytes_by_array": by_kind,
    }
    table.add(
        row,
        f"{spec.label}: kept-epoch per-image vectors, {n_images} / {EXTRAPOLATED_IMAGES:,} images",
        extrapolated / MB,
        "MB",
        f"{len(vectors)} float32 arrays (cls and patch views) of {n_images} x D: {measured / MB:.2f} MB in the npz "
        f"(+ labels {labels / 1024:.1f} KB), {per_image / 1024:.1f} KB/image; one vector per point would be "
        f"{EXTRAPOLATED_IMAGES:,} x {spec.points} x {spec.width} x 4 B = {estimate / MB:.1f} MB; whole spectra file "
        f"probes on / off: kept epoch {files['on_kept'] / MB:.1f} / {files['off_kept'] / MB:.1f} MB (covariances of "
        f"every view {covariances['on_kept'] / MB:.1f} / {covariances['off_kept'] / MB:.1f} MB), other epochs "
        f"{files['on'] / MB:.2f} / {files['off'] / MB:.2f} MB (of which the drift's eigenvectors "
        f"{by_kind['on'].get('eigenvectors', 0) / MB:.2f} MB)",
        text=f"{measured / MB:.2f} / {extrapolated / MB:.1f} MB",
        bytes=out,
    )
    return out


def probe_rows(
    table: Table, spec: ModelSpec, net: torch.nn.Module, profile: Profile, device: torch.device, work: Path
) -> dict[str, Any]:
    """Rows 8.1 and 8.3-8.5 on ``spec`` (vit_small): random images with `PROBE_CLASSES` classes, rows 1a's batch."""
    dataset = h.random_images(profile.vit_images, spec.image_size, classes=PROBE_CLASSES)
    raw = probe_pass(net, dataset, profile.vit_batch, device, profile.groups_repeats)
    probe_pass_row(table, "8.1", spec.label, raw)
    raw["state"] = probe_state_row(table, "8.3", spec, raw)
    summary = probe_summary_row(table, "8.4", spec, raw, dataset, profile.repeats, cold=profile.probe_cold)
    raw.pop("last")
    raw["records"] = probe_record_row(table, "8.5", spec, summary.pop("results"), work)
    raw["summary"] = summary
    return raw


# ---------------------------------------------------------------------------------------------------- main
def spectral_engine(args: Sequence[str], out_dir: Path) -> dict[str, Any]:
    """``benchmarks/spectral_bench.py`` in its own process, with glibc's mmap threshold fixed as it wants."""
    cmd = [sys.executable, str(h.REPO / "benchmarks" / "spectral_bench.py"), *args]
    print(f"== spectral engine: {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=h.REPO, env={**os.environ, **h.MALLOC_ENV}, capture_output=True, text=True)
    text = proc.stdout + (proc.stderr if proc.returncode else "")
    print(text, flush=True)
    (out_dir / "spectral_bench.txt").write_text(text, encoding="utf-8")
    return {"returncode": proc.returncode, "seconds": time.perf_counter() - start, "output": text}


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line (``None`` reads ``sys.argv``)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (about 3 minutes on 2 cores)")
    mode.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny ViT and a few images, every row in well under a minute: checks that the benchmarks "
        "still run, measures nothing",
    )
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench_out/<timestamp>)")
    p.add_argument("--images", type=int, default=None, help="images for rows 1a-2 (CPU default 64, quick 32, smoke 10)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3, quick 2, smoke 1)")
    p.add_argument("--epochs", type=int, default=None, help="quickstart epochs for row 4 (default 2, quick 1)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--skip", nargs="*", default=[], choices=list(SECTIONS), help="sections to leave out")
    return p.parse_args(argv)


def profile_of(args: argparse.Namespace) -> Profile:
    """The mode's sizes with the command line's overrides applied."""
    profile = SMOKE if args.smoke else QUICK if args.quick else DEFAULT
    return dataclasses.replace(
        profile,
        vit_images=args.images or profile.vit_images,
        repeats=args.repeats or profile.repeats,
        epochs=args.epochs or profile.epochs,
    )


def run_sections(
    table: Table, profile: Profile, skip: set[str], work: Path, out_dir: Path, results: dict[str, Any]
) -> None:
    """Every section not in ``skip``, in table order, filling ``results`` (kept even if one section raises)."""
    if "spectral" not in skip:
        results["spectral_bench"] = spectral_engine(profile.spectral_args, out_dir)
    cpu = torch.device("cpu")
    observed: dict[str, Any] = {}
    groups = "jackknife" not in skip
    probes = "probes" not in skip
    if "vit_small" not in skip:
        spec = profile.vit
        print(f"== rows 1-2, 7: {spec.label} (CPU)", flush=True)
        net = spec.build(cpu)
        images = h.random_images(profile.vit_images, spec.image_size)
        both = (profile.repeats, profile.groups_repeats)
        res = _rows_1_and_7(table, spec, spec.label, "1a", net, images, profile.vit_batch, both, groups, work)
        observed["vit_small"] = res.pop("results")
        if probes:
            print(f"== rows 8: the hypothesis probes on {spec.label} (CPU)", flush=True)
            res["probes"] = probe_rows(table, spec, net, profile, cpu, work)
        if "attention" not in skip:
            print(f"== rows 9: the attention family on {spec.label} (CPU)", flush=True)
            res["attention"] = attention_rows(
                table, spec, net, images, profile.vit_batch, profile.groups_repeats, ("9.1", "9.2", "9.3")
            )
        results["vit_small"] = res
        del net
    qs_batch = profile.quickstart_batch or 128
    if "quickstart" not in skip:
        print(f"== rows 1, 7: {profile.quickstart.name} on its analysis subset (CPU)", flush=True)
        dataset, configured_batch = h.quickstart_analysis_images(profile.quickstart_images)
        qs_batch = profile.quickstart_batch or configured_batch
        net = profile.quickstart.build(cpu)
        # ``quickstart N img``, naming the network instead when --smoke shrank it
        label = f"{'quickstart' if profile.quickstart.arch is None else profile.quickstart.name} {len(dataset)} img"
        repeats = max(profile.repeats, profile.quickstart_min_repeats)
        both = (repeats, max(profile.groups_repeats, repeats))
        res = _rows_1_and_7(table, profile.quickstart, label, "1b", net, dataset, qs_batch, both, groups, work)
        observed["quickstart"] = res.pop("results")
        if probes:
            res["probes"] = probe_pass(net, dataset, qs_batch, cpu, both[1])
            res["probes"].pop("last")
            probe_pass_row(table, "8.2", label, res["probes"])
        results["quickstart"] = res
        del net
    if "memory" not in skip:
        print("== rows 2-3, 7.5: peak memory (one process per variant)", flush=True)
        results["memory"] = memory_rows(table, profile, profile.vit_images, qs_batch, compare_groups=groups)
    if "training" not in skip:
        print(f"== row 4: quickstart training, {profile.epochs} epoch(s), observing every epoch", flush=True)
        results["training"] = training_overhead(table, profile.epochs, work, profile.training_overrides)
    if "callback_cost" not in skip:
        print("== rows 17: the callback's cost per logger against the same fit without it", flush=True)
        results["callback_cost"] = callback_cost_rows(table, profile.name, work)
    print("== row 5: eigendecomposition and figures per observation", flush=True)
    eig_and_figure_rows(table, profile, results, observed, skip, work)
    if "gpu" not in skip:
        results["gpu"] = gpu_rows(table, profile, profile.repeats, work)
    if "summary" not in skip:
        print("== rows 10: rank 0's summary against its LAPACK floor (benchmarks/summary_bench.py)", flush=True)
        results["summary"] = summary_rows(table, profile.name)
    if "scale" not in skip:
        print("== rows 11: observation at cluster scale (benchmarks/scale_bench.py)", flush=True)
        results["scale"] = scale_rows(table, profile.name, work)
    if "optimisation" not in skip:
        print("== rows 12: training-time cost of the noise scale and the weights (optimisation_bench.py)", flush=True)
        results["optimisation"] = optimisation_rows(table, profile.name)
    if "curvature" not in skip:
        print("== rows 13: curvature per evaluation, CPU and projected H200 (curvature_bench.py)", flush=True)
        results["curvature"] = curvature_rows(table, profile.name)
    if not {"vit_small", "families"} & skip:
        print("== rows 14: each family that is off by default, on / off (families_bench.py)", flush=True)
        results["families"] = family_rows(table, profile)
    if "peer" not in skip:
        print("== rows 16: side by side with the peer, representation-geometry (peer_bench.py)", flush=True)
        results["peer"] = peer_rows(table, profile.name, work=work, gpu="gpu" not in skip)
    if "widths" not in skip:
        print("== rows 15: D = 768 and 1,024 on the CPU, the memory plan's passes (width_bench.py)", flush=True)
        results["widths"] = width_rows(table, profile.name, work)


def _rows_1_and_7(
    table: Table,
    spec: ModelSpec,
    label: str,
    row: str,
    net: Any,
    data: Any,
    batch: int,
    repeats: tuple[int, int],
    groups: bool,
    work: Path,
) -> dict[str, Any]:
    """Rows 1a (with row 2.1's naive baseline) or 1b of one network, and with ``groups`` its rows 7 right after
    (from the same runs), so the G accumulators they keep (G x the state) are freed before anything else runs; the
    summary timing leaves the noise cache warm. ``repeats``: of rows 1 and of rows 7.1-7.2."""
    cpu, vit = torch.device("cpu"), row == "1a"
    res = overhead(table, label, row, net, data, batch, cpu, repeats[0], work, naive=vit, compare_groups=groups)
    if groups:
        stream = stream_comparison(net, data, batch, cpu, repeats[1])
        rows = ("7.1", "7.3", "7.6") if vit else ("7.2", "7.4", "7.7")
        jk = res.pop("jackknife")
        grouped, off = jk["accumulators"]["grouped"], jk["accumulators"]["off"]
        res["jackknife"] = jackknife_pass_rows(table, rows[:2], label, jk, stream)
        res["jackknife"]["summary"] = jackknife_summary_row(table, rows[2], spec, grouped, off, repeats[0])
    return res


def _failures(results: dict[str, Any], table: Table) -> list[str]:
    """What makes this run incomplete: a failed spectral benchmark, a missing or undeclared row."""
    failed = results.get("spectral_bench", {}).get("returncode", 0)
    return ([f"spectral_bench.py exited with status {failed}"] if failed else []) + table.problems()


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmarks, prints the table, writes ``results.json``; 1 when a row or the engine benchmark failed."""
    args = parse(argv)
    profile = profile_of(args)
    h.MEASURING = profile.name != "smoke"
    if profile.threads:
        os.environ["OMP_NUM_THREADS"] = str(profile.threads)  # for the children; this process is set just below
    if args.threads or profile.threads:
        torch.set_num_threads(args.threads or profile.threads)
    quiet()
    out_dir = args.out or h.REPO / "bench_out" / datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tgo_bench_"))
    skip = set(args.skip)
    env = h.environment()
    started = time.perf_counter()
    print(f"TGO benchmarks ({profile.name}) -> {out_dir}")
    print(h.environment_line(env), flush=True)
    results: dict[str, Any] = {
        "environment": env,
        "mode": profile.name,
        "quick": args.quick,
        "profile": dataclasses.asdict(profile),
        "args": vars(args) | {"out": str(out_dir)},
        "declared_rows": list(ROWS),
    }
    table = Table()
    try:
        run_sections(table, profile, skip, work, out_dir, results)
        table.skip_sections(skip)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        results["table"] = table.rows
        results["failures"] = _failures(results, table)
        results["wall_seconds"] = time.perf_counter() - started
        results["load_average_1m_end"] = round(os.getloadavg()[0], 2)
        (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    rendered = table.render()
    (out_dir / "table.txt").write_text(h.environment_line(env) + "\n\n" + rendered + "\n", encoding="utf-8")
    print()
    print(f"TGO observation benchmark ({profile.name}) - {h.environment_line(env)}")
    print(
        f"finished in {results['wall_seconds']:.0f} s, load average {results['load_average_1m_end']} at end; "
        f"every value is a median or a ratio measured in this run"
    )
    print(rendered)
    print(f"\nwritten: {out_dir / 'results.json'}")
    for failure in results["failures"]:
        print(f"INCOMPLETE: {failure}", file=sys.stderr)
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
