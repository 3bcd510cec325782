"""Shared pieces of the observation benchmarks: models, images, the naive baseline, timing and memory measurement.

Nothing here asserts anything: it measures. Timing follows two rules because the development machine is shared
(2 cores, other processes running): compared variants are *interleaved* (baseline, A, baseline, B, baseline, ...)
so drifting load hits all of them alike, and every figure is a *median* of repeats or a median of paired ratios
(each variant run divided by the mean of the two baseline runs around it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import torch
from torch.utils.data import DataLoader, TensorDataset

if TYPE_CHECKING:
    from tgo.observatory import ObservationSettings, Results
    from tgo.observatory.families import FamilyRun

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
MB = 1024**2


# ---------------------------------------------------------------------------------------------------- environment
def environment() -> dict[str, Any]:
    """Which BLAS/threads/devices the benchmark ran with (printed above the table and stored in the JSON)."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cuda": torch.cuda.is_available(),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
    }
    parallel = torch.__config__.parallel_info()
    info["torch_parallel_info"] = parallel
    keep = ("ATen parallel backend", "Math Kernel Library", "MKL-DNN", "oneDNN", "OpenMP 20", "OpenBLAS")
    info["torch_blas"] = "; ".join(line.strip() for line in parallel.splitlines() if any(k in line for k in keep))
    try:
        from threadpoolctl import threadpool_info

        info["numpy_threadpools"] = [
            {k: pool.get(k) for k in ("user_api", "internal_api", "version", "num_threads", "threading_layer")}
            for pool in threadpool_info()
        ]
    except ImportError:
        info["numpy_threadpools"] = "threadpoolctl not installed"
    return info


def environment_line(info: dict[str, Any]) -> str:
    """One line naming BLAS and threads."""
    pools = info["numpy_threadpools"]
    if isinstance(pools, list):
        numpy_blas = ", ".join(
            f"{p['internal_api']} {p['version'] or ''} x{p['num_threads']} ({p['user_api']})".replace("  ", " ")
            for p in pools
        )
    else:
        numpy_blas = pools
    cuda = ", ".join(info["cuda_devices"]) or "no GPU"
    return (
        f"torch {info['torch']}: {info['torch_threads']} intra-op / {info['torch_interop_threads']} inter-op "
        f"threads; {info['torch_blas']} | numpy thread pools: {numpy_blas} | {info['cpu_count']} CPUs, {cuda}, "
        f"load average {info['load_average_1m']} at start"
    )


# ---------------------------------------------------------------------------------------------------- models, images
MODEL_KINDS = ("vit_small", "quickstart", "tiny")
"""What `build_model` builds; also the MODEL argument of ``benchmarks._memory_child``."""

TINY_ARCH: dict[str, int] = {"embed_dim": 32, "depth": 2, "num_heads": 2}
"""The ``--smoke`` stand-in's shape: small enough that every row runs in milliseconds, still a timm ViT."""

TINY_PATCH = 8
"""Patch size of the tiny ViT: 32 px images give 16 patches + CLS = 17 tokens."""


def build_model(
    kind: str,
    device: torch.device | str = "cpu",
    image_size: int = 224,
    seed: int = 0,
    arch: dict[str, int] | None = None,
) -> torch.nn.Module:
    """One of `MODEL_KINDS`, random init (no download), eval mode: timm ``vit_small_patch16_224`` (always 224 px),
    the quickstart network (``conf/model/vit_quickstart.yaml``, 10 classes, its ``arch`` keys replaced by ``arch``)
    or the tiny ViT, built with timm directly so a memory child that measures it does not import Lightning."""
    import timm

    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {list(MODEL_KINDS)}")
    torch.manual_seed(seed)
    if kind == "vit_small":
        net = timm.create_model("vit_small_patch16_224", pretrained=False)
    elif kind == "tiny":
        net = timm.create_model(
            "vit_tiny_patch16_224", pretrained=False, img_size=image_size, patch_size=TINY_PATCH, **TINY_ARCH
        )
    else:
        from omegaconf import OmegaConf

        from tgo.model import build_timm_model

        cfg = OmegaConf.load(CONF / "model" / "vit_quickstart.yaml")
        shape = OmegaConf.to_container(cfg.arch) | (arch or {})
        net = build_timm_model(cfg.name, num_classes=10, img_size=image_size, in_chans=3, **shape)
    return net.eval().to(device)


def random_images(n: int, size: int, seed: int = 0, classes: int = 1) -> TensorDataset:
    """``n`` normalised-noise RGB images of ``size`` px, materialised once so data loading costs nothing, labelled
    ``0 .. classes - 1`` round robin: the probes' class geometry and decoding need at least two classes (one class
    short-cuts them to NaN)."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n, dtype=torch.long) % max(int(classes), 1)
    return TensorDataset(torch.randn(n, 3, size, size, generator=gen), labels)


def compose_quickstart(output_dir: Path, overrides: Sequence[str] = ()) -> Any:
    """``conf/train.yaml`` with the quickstart experiment, composed as ``python -m tgo.train`` would."""
    from hydra import compose, initialize_config_module

    from tgo.config import CONFIG_MODULE

    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return compose("train", overrides=[f"paths.output_dir={output_dir}", *overrides])


def quickstart_analysis_images(limit: int | None = None) -> tuple[TensorDataset, int]:
    """The quickstart analysis subset (real digits, eval transform; the first ``limit`` images, ``None``: all 200)
    materialised, and its configured batch size. The labels are kept, so the jackknife groups are class-stratified
    as in training (``random_images`` has one class: its groups are dealt round robin by position)."""
    from hydra.utils import instantiate

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_quickstart(Path(tmp))
        datamodule = instantiate(cfg.data).validate()
        dataset = datamodule.analysis_dataset
        count = len(dataset) if limit is None else min(limit, len(dataset))
        items = [dataset[i] for i in range(count)]
        images = torch.stack([item[0] for item in items])
        labels = torch.as_tensor([int(item[1]) for item in items], dtype=torch.long)
        return TensorDataset(images, labels), int(datamodule.analysis_batch_size)


# ---------------------------------------------------------------------------------------------------- the passes
def plain_forward(net: torch.nn.Module, dataset: TensorDataset, batch_size: int, device: torch.device) -> None:
    """The denominator: eval mode, inference mode, the same loader over the same images."""
    net.eval()
    with torch.inference_mode():
        for images, _ in DataLoader(dataset, batch_size=batch_size, shuffle=False):
            net(images.to(device, non_blocking=True))
    synchronize(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Store:
    """The naive baseline's 'accumulator': keeps a copy of every activation batch (``keep=False``: does nothing)."""

    def __init__(self, keep: bool = True) -> None:
        self.batches: list[torch.Tensor] = []
        self.keep = keep

    def update(self, x: torch.Tensor) -> None:
        if self.keep:
            self.batches.append(x.reshape(-1, x.shape[-1]).clone())


def _hooked_forward(
    net: torch.nn.Module,
    dataset: TensorDataset,
    points: Sequence[Any],
    batch_size: int,
    device: torch.device,
    keep: bool,
) -> dict[str, _Store]:
    from tgo.observatory import ActivationHooks, exact_inference

    stores = {p.name: _Store(keep) for p in points}
    net.eval()
    with exact_inference(device.type), ActivationHooks.for_points(net, points, stores):
        for images, _ in DataLoader(dataset, batch_size=batch_size, shuffle=False):
            net(images.to(device, non_blocking=True))
    return stores


def naive_observation(
    net: torch.nn.Module, dataset: TensorDataset, points: Sequence[Any], batch_size: int, device: torch.device
) -> None:
    """Store every point's activations (same hooks, same exact-inference context), then ``torch.cat`` +
    ``torch.cov`` + float64 ``eigvalsh`` per point: the obvious approach the streaming accumulators replace."""
    stores = _hooked_forward(net, dataset, points, batch_size, device, keep=True)
    for p in points:
        rows = torch.cat(stores[p.name].batches)
        stores[p.name].batches.clear()
        cov = torch.cov(rows.T)
        del rows
        torch.linalg.eigvalsh(cov.double()).cpu()


def hooked_noop_forward(
    net: torch.nn.Module, dataset: TensorDataset, points: Sequence[Any], batch_size: int, device: torch.device
) -> None:
    """The forward with the 15 hooks attached but doing nothing: what hooking and the exact context cost alone."""
    _hooked_forward(net, dataset, points, batch_size, device, keep=False)
    synchronize(device)


def stream_pass(
    net: torch.nn.Module,
    dataset: TensorDataset,
    points: Sequence[Any],
    batch_size: int,
    device: torch.device,
    groups: int,
    families: Sequence[FamilyRun] = (),
) -> dict[str, Any]:
    """The streaming pass alone (forward + hooks + float64 Gram updates) as ``observe_dataset`` runs it, without the
    reduce: the same loader (with ``groups`` > 0 visited group by group; with started ``families`` batches carry
    subset indices) and the same ``stream_activations`` call. Returns the accumulators, one per point (not reduced)."""
    from tgo.observatory import ShardPlan
    from tgo.observatory.pipeline import group_of_items, observation_loader
    from tgo.observatory.stream import stream_activations

    plan = ShardPlan(batch_size=batch_size)
    group_of_item = group_of_items(dataset, groups) if groups else None
    loader = observation_loader(dataset, plan, group_of_item=group_of_item, indexed=bool(families))
    accumulators = stream_activations(
        net, loader, points, device=device, gram_dtype=torch.float64, groups=groups, families=families
    )
    synchronize(device)
    return accumulators


def family_pass(
    family: Any, net: torch.nn.Module, dataset: TensorDataset, batch_size: int, device: torch.device, settings: Any
) -> tuple[Callable[[], None], Callable[[], None], dict[str, Any]]:
    """``(off, on, last)``: `stream_pass` with the default groups, and the same with one measurement family started as
    an observation starts it (`tgo.observatory.pipeline.start_families`) and streamed along; ``last`` holds each
    one's last accumulators (``"on"``: with the family's run). The image groups are dealt once, outside both."""
    from tgo.observatory import ShardPlan, vit_points
    from tgo.observatory.pipeline import group_of_items, start_families

    points, groups = vit_points(net), default_groups()
    group_of_item = group_of_items(dataset, groups) if groups else None
    last: dict[str, Any] = {}

    def off() -> None:
        last["off"] = stream_pass(net, dataset, points, batch_size, device, groups)

    def on() -> None:
        plan = ShardPlan(batch_size=batch_size)
        (run,) = start_families(
            [family],
            net,
            points,
            settings=settings,
            plan=plan,
            n_images=len(dataset),
            group_of_item=group_of_item,
            device=device,
            dataset=dataset,
        )
        last["on"] = stream_pass(net, dataset, points, batch_size, device, groups, families=[run]), run

    return off, on, last


class PhaseTimer:
    """Times the phases of ``observe_and_record`` (stream, reduce, eigendecompose + observables, records) by wrapping
    the functions it calls, so the breakdown comes from the very runs whose total is reported. With
    ``keep_accumulators``, ``accumulators`` holds the reduced accumulators the last summary received; with a
    ``device`` the stream phase ends when the device has finished it (GPU work charged to the pass rather than to
    whichever later phase first waits for the device)."""

    PHASES = ("stream", "reduce", "eig_observables", "records")

    def __init__(self, keep_accumulators: bool = False, device: torch.device | None = None) -> None:
        self.keep_accumulators, self.device = keep_accumulators, device
        self.accumulators: Any = None
        self.reset()

    def reset(self) -> None:
        """Forgets the samples so far (warm-up runs)."""
        self.samples: dict[str, list[float]] = {k: [] for k in self.PHASES}

    def _wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if phase == "eig_observables" and self.keep_accumulators:
                self.accumulators = args[0] if args else kwargs.get("accumulators")
            start = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
                if phase == "stream" and self.device is not None:
                    synchronize(self.device)
                return out
            finally:
                self.samples[phase].append(time.perf_counter() - start)

        return timed

    def attached(self) -> contextlib.AbstractContextManager[None]:
        """Wraps the names ``tgo.observatory.pipeline`` looks up at call time, restoring them on exit."""
        from tgo.observatory import pipeline
        from tgo.records import RecordWriter

        names = {"stream": "stream_activations", "reduce": "reduce_accumulators", "eig_observables": "summarize_shared"}
        targets = {phase: (pipeline, name) for phase, name in names.items()}
        return patched({**targets, "records": (RecordWriter, "write_observation")}, self._wrap)

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.samples.items() if v}


def observation_settings(gram_dtype: str = "float64", groups: int | None = None) -> ObservationSettings:
    """The default ``ObservationSettings`` (what the callback runs with) with the Gram precision under test and, unless
    ``None``, ``groups`` jackknife groups (``0``: no jackknife)."""
    from tgo.observatory import ObservationSettings

    settings = ObservationSettings().replace(gram_dtype=gram_dtype)
    return settings if groups is None else settings.replace(groups=groups)


def classifier(net: torch.nn.Module, optimizer: Callable[[Any], torch.optim.Optimizer]) -> Any:
    """A user's LightningModule around ``net`` (cross-entropy, ``optimizer(parameters)``), in training mode."""
    import lightning as L
    import torch.nn.functional as F

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net.train()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            images, labels = batch
            return F.cross_entropy(self.net(images), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return optimizer(self.parameters())

    return Classifier()


def subspace_history(results: Any) -> Any:
    """The image-vector family's ``SubspaceHistory`` a later epoch reads from its records, from ``results`` (every
    point's ``all`` view eigenvectors, as both the first and the previous observation)."""
    from tgo.observatory.families.image_vectors import SubspaceHistory

    kept = {
        key.point: (r.arrays["eigenvectors"], int(r.arrays["components_90"]))
        for key, r in results.items()
        if key.view == "all" and "eigenvectors" in r.arrays
    }
    return SubspaceHistory(init=kept, prev=kept)


def figures_off() -> dict[str, bool]:
    """Every ``observation.figures`` switch off: the core's and those the families registered."""
    from tgo.observatory import ObservationSettings

    figures = ObservationSettings().figures
    core = [f.name for f in dataclasses.fields(figures) if isinstance(f.default, bool)]
    return dict.fromkeys([*core, *figures.extra], False)


def default_groups() -> int:
    """The jackknife groups ``G`` of the default ``ObservationSettings`` (what every "ours" figure runs with)."""
    from tgo.observatory import ObservationSettings

    return int(ObservationSettings().groups)


NOISE_CACHES = (("tgo.spectral.catalogue", "noise_expectation"), ("tgo.spectral.baselines", "noise_spectra"))
"""The ``functools.lru_cache``s of the finite-sample noise baselines (computed once per (rows, width) per process)."""


def clear_noise_caches() -> list[str]:
    """Empties the noise-baseline caches, so the next summary pays the first-call cost again; returns those cleared
    (none: the library no longer caches there)."""
    import importlib

    cleared = []
    for module, name in NOISE_CACHES:
        fn = getattr(importlib.import_module(module), name, None)
        if callable(getattr(fn, "cache_clear", None)):
            fn.cache_clear()
            cleared.append(f"{module}.{name}")
    return cleared


class SumCounter:
    """An identity ``all_reduce_sum`` (one process) that records the bytes of every call: the all-reduce traffic."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        self.calls.append(t.numel() * t.element_size())
        return t

    def reset(self) -> None:
        self.calls = []


def observation(
    net: torch.nn.Module,
    dataset: TensorDataset,
    points: Sequence[Any],
    batch_size: int,
    device: torch.device,
    settings: ObservationSettings,
    out_dir: Path,
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Results | None:
    """The full observation pass exactly as the callback runs it (``observe_and_record``), one process (rank 0, so
    its ``Results`` are returned), into a fresh run directory under ``out_dir``; ``settings`` are built outside the
    timed region, ``all_reduce_sum`` is the sum collective (``None``: identity; a `SumCounter` counts the bytes)."""
    from tgo.observatory import RecordPlan, ShardPlan, observe_and_record
    from tgo.records import RecordWriter

    run_dir = Path(tempfile.mkdtemp(dir=out_dir))
    return observe_and_record(
        net,
        dataset,
        points,
        settings=settings,
        plan=ShardPlan(batch_size=batch_size),
        record=RecordPlan(writer=RecordWriter(run_dir), epoch=0, step=0),
        all_reduce_sum=all_reduce_sum or (lambda t: t),
        is_global_zero=True,
        device=device,
    )


# ---------------------------------------------------------------------------------------------------- timing
MEASURING = True
"""``False`` under ``--smoke``, whose timings mean nothing: `interleaved` (and row 1's own warm-up) then runs no
warm-up and no ``gc.collect()`` before each timed call. With torch, timm and Lightning loaded, one collection takes
0.3-0.8 s on the 2-core machine: 50 of them were most of the smoke run's CPU time."""


def interleaved(
    baseline: Callable[[], Any], variants: dict[str, Callable[[], Any]], repeats: int, warmup: bool = True
) -> dict[str, dict[str, float]]:
    """Runs ``B V1 B V2 ... B`` ``repeats`` times (one shared baseline run between neighbours).

    Returns:
        ``{name: {"median_s", "ratio", "ratios", "runs"}}`` with ``ratio`` the median over repeats of the variant's
        time divided by the mean of the two baseline runs around it (``ratios``: each repeat's, ``runs``: each
        repeat's seconds); ``"baseline"`` holds the baseline's median.
    """
    if warmup and MEASURING:
        baseline()
        for fn in variants.values():
            fn()
    base: list[float] = []
    runs: dict[str, list[float]] = {k: [] for k in variants}
    ratios: dict[str, list[float]] = {k: [] for k in variants}

    def timed(fn: Callable[[], Any]) -> float:
        if MEASURING:
            gc.collect()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    base.append(timed(baseline))
    for _ in range(repeats):
        for name, fn in variants.items():
            seconds = timed(fn)
            base.append(timed(baseline))
            runs[name].append(seconds)
            ratios[name].append(seconds / ((base[-2] + base[-1]) / 2))
    out = {
        name: {
            "median_s": statistics.median(runs[name]),
            "ratio": statistics.median(ratios[name]),
            "ratios": ratios[name],
            "runs": runs[name],
        }
        for name in variants
    }
    out["baseline"] = {"median_s": statistics.median(base), "ratio": 1.0}
    return out


def paired(off: Callable[[], Any], on: Callable[[], Any], repeats: int, warmup: bool = True) -> dict[str, Any]:
    """``on`` against ``off`` (`interleaved`): the median ratio, every ratio and both medians."""
    res = interleaved(off, {"on": on}, repeats, warmup)
    r, off_s = res["on"], res["baseline"]["median_s"]
    return {"repeats": repeats, "ratio": r["ratio"], "ratios": r["ratios"], "on_s": r["median_s"], "off_s": off_s}


def alternated(
    variants: dict[str, Callable[[], Any]], repeats: int, *, warmup: bool = True, cold: bool = False
) -> dict[str, Any]:
    """Each variant in turn, ``repeats`` times (after one untimed call of each with ``warmup``: the noise-baseline
    cache then holds every shape); with ``cold`` one more call of each with the noise caches cleared just before it
    (in order, so the last one leaves every shape cached again).

    Returns:
        ``{"warm_s": {name: median}, "warm_runs": {name: [seconds]}, "cold_s": {name: seconds} (empty without
        ``cold`` or when no cache was found to clear), "caches_cleared": [...], "last": {name: last result}}``.
    """

    def timed(name: str) -> float:
        start = time.perf_counter()
        last[name] = variants[name]()
        return time.perf_counter() - start

    last: dict[str, Any] = {}
    if warmup:
        for name in variants:
            timed(name)
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(max(repeats, 1)):
        for name in variants:
            runs[name].append(timed(name))
    cold_s: dict[str, float] = {}
    cleared = clear_noise_caches() if cold else []
    for i, name in enumerate(variants if cleared else ()):
        if i:
            clear_noise_caches()
        cold_s[name] = timed(name)
    warm = {name: statistics.median(v) for name, v in runs.items()}
    return {"warm_s": warm, "warm_runs": runs, "cold_s": cold_s, "caches_cleared": cleared, "last": last}


@contextlib.contextmanager
def patched(targets: dict[str, tuple[Any, str]], wrap: Callable[[str, Callable[..., Any]], Any]) -> Iterator[None]:
    """Every ``owner.attribute`` of ``targets`` (``{name: (owner, attribute)}``, the owner a class: its method, or a
    module: a function the library looks up there at call time) replaced by ``wrap(name, original)`` while the block
    runs, restored on exit (`unittest.mock.patch.object`)."""
    with contextlib.ExitStack() as stack:
        for name, (owner, attr) in targets.items():
            stack.enter_context(mock.patch.object(owner, attr, wrap(name, inspect.getattr_static(owner, attr))))
        yield


@contextlib.contextmanager
def timed_calls(targets: dict[str, tuple[Any, str]], *, cpu: bool = False) -> Iterator[dict[str, list[Any]]]:
    """Times every call of some functions while the block runs (`patched`): where a pass's time goes without a
    profiler's overhead. Nested wrapped calls count in each of their wrappers.

    Yields:
        ``{name: [seconds of each call]}``, filled while the block runs; with ``cpu`` each call's ``(wall, process
        CPU)`` seconds (the CPU of every thread of the process).
    """
    samples: dict[str, list[Any]] = {name: [] for name in targets}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start, start_cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall = time.perf_counter() - start
                samples[name].append((wall, time.process_time() - start_cpu) if cpu else wall)

        return timed

    with patched(targets, wrap):
        yield samples


def free_port() -> int:
    """A TCP port free on this machine now (for a process group's ``MASTER_PORT``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# ---------------------------------------------------------------------------------------------------- memory
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
"""glibc's mmap threshold fixed at 1 MB, so freed batch temporaries leave RSS instead of inflating later peaks."""


def run_memory_children(
    specs: Sequence[Sequence[str]], *, fresh: bool = True, in_process: bool = False
) -> list[dict[str, Any]]:
    """One `benchmarks._memory_child.measure` per spec (``MODEL SIZE IMAGES BATCH VARIANT``), in spec order.

    ``fresh``: one ``python -m benchmarks._memory_child`` process per spec (`MALLOC_ENV` set there), so nothing freed
    by an earlier variant lingers in the heap and peaks are clean; ``False``: every spec in one child (each
    interpreter start, torch + timm imports, costs seconds). ``in_process`` (``--smoke``): every spec in this process,
    no interpreter start at all; the peaks then sit on this process's heap and mean nothing.
    """
    if in_process:
        from benchmarks._memory_child import measure

        return [measure(m, int(size), int(images), int(batch), variant) for m, size, images, batch, variant in specs]
    env = {**os.environ, **MALLOC_ENV, "PYTHONPATH": str(REPO)}
    out = []
    for args in [list(spec) for spec in specs] if fresh else [[arg for spec in specs for arg in spec]]:
        cmd = [sys.executable, "-m", "benchmarks._memory_child", *args]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"memory child {args} failed:\n{proc.stderr[-3000:]}")
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        out += lines[-1:] if fresh else lines
    return out


def _status_kb(key: str) -> int:
    with open("/proc/self/status", encoding="utf-8", errors="replace") as fh:  # Name: is the bytes a process set
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


class PeakRSS:
    """Peak resident memory above the RSS at entry, in bytes.

    On Linux the kernel's high-water mark is reset at entry (``/proc/self/clear_refs`` <- 5) and read at exit
    (``VmHWM``): exact, no sampling. Elsewhere a thread samples RSS every 5 ms (psutil).
    """

    def __enter__(self) -> PeakRSS:
        if MEASURING:  # --smoke measures nothing (and may measure in its own, large heap: `run_memory_children`)
            gc.collect()
        try:
            self.start = _status_kb("VmRSS") * 1024
            with open("/proc/self/clear_refs", "w", encoding="utf-8") as fh:
                fh.write("5")
            self._kernel = _status_kb("VmHWM") * 1024 <= self.start + 4 * MB
        except (OSError, KeyError):
            self._kernel = False
        if not self._kernel:
            import psutil

            proc = psutil.Process()
            self.start = self._peak = proc.memory_info().rss
            self._stop = threading.Event()

            def sample() -> None:
                while True:
                    self._peak = max(self._peak, proc.memory_info().rss)
                    if self._stop.wait(0.005):
                        break

            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._kernel:
            self.peak_delta = _status_kb("VmHWM") * 1024 - self.start
            self.method = "kernel high-water mark (VmHWM after clear_refs)"
        else:
            self._stop.set()
            self._thread.join()
            self.peak_delta = self._peak - self.start
            self.method = "RSS sampled every 5 ms"
