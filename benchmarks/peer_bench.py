"""Rows 16 of ``python -m benchmarks``: TGO side by side with the peer that streams covariances, in one run.

The peer is ``representation-geometry`` 0.1.0 (MIT; the ``bench`` extra of pyproject.toml): forward hooks on the
blocks, a running float32 covariance per block (parallel Welford after moving every batch to the CPU), then a float32
``eigh`` per block. Both observe the same network (vit_small 224 px; ``--smoke``: the tiny ViT), the same random
images, batch size and points: every block's output, all tokens (the peer's ``hook_point="residual_output"``,
TGO's ``block_NN`` points). The peer runs its spectral metrics only (``metrics="spectrum"``: no 512-row sample SVD,
no subspace novelty), its fastest configuration. TGO runs three ways, interleaved with the peer
(``P T1 P T2 P T3 P ...``, `_harness.interleaved`, every TGO run divided by the mean of the two peer runs around it):
like for like (``groups=0``, every measurement family off) with a float64 Gram and with a float32 Gram, and with its
default settings (G jackknife groups, the probes, attention and the rest of what an observation computes) on the same
points. A TGO observation is ``observe_and_record``: stream, reduce, the whole catalogue per point, records written.

Errors: each one's largest relative error over the blocks of effective rank, participation ratio and stable rank
against an independent float64 two-pass reference (the same forward's activations kept whole, float64 mean, then
float64 centred Gram, numpy ``eigvalsh``, the three formulas written out here). The definitions agree: the peer's
``d_entropy`` is TGO's ``effective_rank`` (``exp`` of the Shannon entropy of ``p = lambda / sum lambda``), its
``d_pr`` TGO's ``participation_ratio`` ((sum lambda)^2 / sum lambda^2) and both call ``sum lambda / lambda_max`` the
stable rank; all three are scale free, so the peer's ``1 / (n - 1)`` and TGO's normalisation cannot differ in them.

Without the peer installed the rows are skipped with one line. With CUDA, row 16.9 repeats the like-for-like float64
ratio on the GPU (the peer copies every batch to the CPU, TGO accumulates on the device).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks import _harness as h
from benchmarks._table import PEER_ROWS

PEER = "representation-geometry"
PEER_VERSION = "0.1.0"
METRICS = {"effective_rank": "d_entropy", "participation_ratio": "d_pr", "stable_rank": "stable_rank"}
"""TGO's observable -> the peer's column of the same quantity (module docstring: the definitions agree)."""
TIME_TARGET = 1.0
"""Like for like on a CPU: TGO's seconds per observation at most the peer's."""
ERROR_TARGET = 1000.0
"""Like for like: the peer's largest error at least this many times TGO's (float64 Gram)."""
IMAGES = {"default": 32, "quick": 16, "smoke": 10}
"""Images per observation by mode (``--smoke``: G = 10 needs 10 for the defaults variant)."""
BATCH = {"default": 16, "quick": 16, "smoke": 4}
VARIANTS = ("f64", "f32", "defaults")
"""TGO's runs: like for like with each Gram precision, and the default settings."""
GPU_PEER_ROW = "16.9"
OWN_WORK_ROW = "16.10"
OWN_WORK: dict[str, tuple[tuple[str, str, str], ...]] = {
    "tgo": (
        ("tgo.spectral.accumulator", "StreamingCovariance", "update"),
        ("tgo.observatory.pipeline", "", "summarize_and_record"),
    ),
    "peer": (
        ("representation_geometry.online", "RunningCovariance", "update"),
        ("representation_geometry.api", "", "compute_metrics_from_stats"),
    ),
}
"""Row 16.10: per tool, the functions that are its own work (module, class or ``""``, name): what it adds to the
forward both share. TGO: the Gram updates and the summary with its records; the peer: its Welford updates and its
metrics (the float32 ``eigh``), as ``analyze_model`` of version 0.1.0 calls them."""


def peer_version() -> str | None:
    """The installed peer's version, ``None`` when it is absent."""
    if importlib.util.find_spec("representation_geometry") is None:
        return None
    try:
        return importlib.metadata.version(PEER)
    except importlib.metadata.PackageNotFoundError:
        return None


def block_points(net: torch.nn.Module) -> list[Any]:
    """TGO's ``block_NN`` points of ``net`` (every block's output, all tokens): what the peer hooks."""
    from tgo.observatory import vit_points

    return [p for p in vit_points(net) if p.module.startswith("blocks.")]


def tgo_settings(variant: str) -> Any:
    """``defaults``: the default settings; ``f64`` / ``f32``: like for like (no jackknife, every family off)."""
    if variant == "defaults":
        return h.observation_settings("float64")
    settings = h.observation_settings("float64" if variant == "f64" else "float32", groups=0)
    values = settings.to_dict()
    off = {k: {**v, "enabled": False} for k, v in values.items() if isinstance(v, dict) and "enabled" in v}
    return settings.replace(**off, keep_covariance="none")


def _images_only(dataset: TensorDataset, batch: int) -> DataLoader:
    """The peer calls ``model(*batch)``: batches of images alone, in the order TGO's loader visits them."""
    return DataLoader(TensorDataset(dataset.tensors[0]), batch_size=batch, shuffle=False)


def peer_observation(net: torch.nn.Module, dataset: TensorDataset, batch: int, device: torch.device) -> Any:
    """One observation by the peer's public API: its spectral metrics of every block's output, all tokens."""
    from representation_geometry import analyze_model

    result = analyze_model(
        model=net,
        dataloader=(images for (images,) in _images_only(dataset, batch)),
        max_tokens=None,
        metrics="spectrum",
        hook_point="residual_output",
        layers="all",
        device=device,
    )
    h.synchronize(device)
    return result


def reference(net: torch.nn.Module, dataset: TensorDataset, batch: int, device: torch.device) -> dict[str, Any]:
    """The float64 two-pass reference per block: activations kept whole, mean, then the centred Gram, ``eigvalsh``."""
    kept: dict[int, list[np.ndarray]] = {i: [] for i in range(len(net.blocks))}  # type: ignore[arg-type]
    handles = [
        block.register_forward_hook(lambda m, i, out, k=k: kept[k].append(out.detach().cpu().numpy()))
        for k, block in enumerate(net.blocks)  # type: ignore[arg-type]
    ]
    try:
        with torch.no_grad():
            for (images,) in _images_only(dataset, batch):
                net(images.to(device))
    finally:
        for handle in handles:
            handle.remove()
    out: dict[str, Any] = {}
    for k, parts in kept.items():
        x = np.concatenate([p.reshape(-1, p.shape[-1]) for p in parts]).astype(np.float64)
        x -= x.sum(axis=0) / x.shape[0]  # pass 1: the mean; pass 2: the centred Gram
        eigs = np.clip(np.linalg.eigvalsh(x.T @ x / (x.shape[0] - 1)), 0.0, None)
        p = eigs[eigs > 0] / eigs.sum()
        out[f"block_{k + 1:02d}"] = {
            "effective_rank": float(np.exp(-(p * np.log(p)).sum())),
            "participation_ratio": float(eigs.sum() ** 2 / (eigs**2).sum()),
            "stable_rank": float(eigs.sum() / eigs.max()),
        }
    return out


def peer_values(result: Any, names: Sequence[str]) -> dict[str, dict[str, float]]:
    """The peer's three metrics per block, named as TGO names the points (``names``, in block order)."""
    rows = result.metrics.sort_values("layer")
    return {
        name: {ours: float(row[theirs]) for ours, theirs in METRICS.items()}
        for name, (_, row) in zip(names, rows.iterrows(), strict=True)
    }


def tgo_values(results: Any) -> dict[str, dict[str, float]]:
    """TGO's three observables per point (the ``all`` view)."""
    return {point: {m: float(r.observables[m]) for m in METRICS} for point, r in results.by_point().items()}


def largest_errors(values: dict[str, dict[str, float]], ref: dict[str, Any]) -> dict[str, float]:
    """Per metric, the largest ``|value - reference| / reference`` over the blocks."""
    return {m: max(abs(values[p][m] - ref[p][m]) / abs(ref[p][m]) for p in ref) for m in METRICS}


@contextlib.contextmanager
def own_work_clock() -> Iterator[dict[str, float]]:
    """While the block runs, the seconds spent inside each `OWN_WORK` function, summed per tool (``{"tgo": s,
    "peer": s}``; the caller resets it between runs). The functions are wrapped where their callers look them up and
    restored on exit. On a CPU only: a GPU's kernels finish after the functions return."""
    seconds = {tool: 0.0 for tool in OWN_WORK}
    saved: list[tuple[Any, str, Any]] = []

    def timed(tool: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[tool] += time.perf_counter() - start

        return wrapper

    try:
        for tool, places in OWN_WORK.items():
            for module, owner, name in places:
                target = importlib.import_module(module)
                target = getattr(target, owner) if owner else target
                saved.append((target, name, getattr(target, name)))  # AttributeError: another version of the peer
                setattr(target, name, timed(tool, saved[-1][2]))
        yield seconds
    finally:
        for target, name, original in reversed(saved):
            setattr(target, name, original)


def side_by_side(
    net: torch.nn.Module,
    dataset: TensorDataset,
    batch: int,
    device: torch.device,
    repeats: int,
    work: Path,
    own_work: bool = False,
) -> dict[str, Any]:
    """The interleaved timings and every one's largest errors against the reference; with ``own_work`` also each
    run's seconds inside its tool's own functions (`own_work_clock`)."""
    points = block_points(net)
    settings = {v: tgo_settings(v) for v in VARIANTS}
    last: dict[str, Any] = {}
    own: dict[str, list[float]] = {"peer": [], **{v: [] for v in VARIANTS}}

    def clocked(name: str, tool: str, body: Callable[[], None]) -> None:
        clock.update(dict.fromkeys(clock, 0.0))  # `clock`: the seconds `own_work_clock` adds to, bound below
        body()
        if clock:
            own[name].append(clock[tool])

    def tgo(variant: str) -> Callable[[], None]:
        def body() -> None:
            last[variant] = h.observation(net, dataset, points, batch, device, settings[variant], work)
            h.synchronize(device)

        return lambda: clocked(variant, "tgo", body)

    def peer_body() -> None:
        last["peer"] = peer_observation(net, dataset, batch, device)

    no_clock: dict[str, float] = {}
    with own_work_clock() if own_work else contextlib.nullcontext(no_clock) as clock:
        timings = h.interleaved(lambda: clocked("peer", "peer", peer_body), {v: tgo(v) for v in VARIANTS}, repeats)
    ref = reference(net, dataset, batch, device)
    names = [p.name for p in points]
    values = {"peer": peer_values(last["peer"], names), **{v: tgo_values(last[v]) for v in VARIANTS}}
    return {
        "images": len(dataset),
        "batch": batch,
        "points": names,
        "repeats": repeats,
        "groups": settings["defaults"].groups,
        "timings": timings,
        "own_work_s": {name: runs for name, runs in own.items() if runs},
        "errors": {name: largest_errors(v, ref) for name, v in values.items()},
        "reference": ref,
        "values": values,
    }


def _error_text(errors: dict[str, float]) -> str:
    return ", ".join(f"{m} {e:.1e}" for m, e in errors.items())


def peer_rows(table: Any, mode: str, *, work: Path, repeats: int | None = None, gpu: bool = True) -> dict[str, Any]:
    """Rows 16.1-16.8 and 16.10 on the CPU and, with CUDA and ``gpu``, row 16.9 (skipped with one line without the
    peer; row 16.9 is left to ``--skip gpu`` without ``gpu``)."""
    version = peer_version()
    if version is None:
        why = f"{PEER} not installed"
        rows = [*PEER_ROWS, GPU_PEER_ROW] if gpu else list(PEER_ROWS)
        table.skip(rows, "side by side with the peer", why, "pip install -e '.[bench]'", shown_as="16")
        return {"skipped": why}
    spec = model_of(mode)
    repeats = repeats or (1 if mode == "smoke" else 2 if mode == "quick" else 3)
    dataset = h.random_images(IMAGES[mode], spec["size"])
    cpu = torch.device("cpu")
    net = h.build_model(spec["kind"], cpu, spec["size"])
    raw = side_by_side(net, dataset, BATCH[mode], cpu, repeats, work, own_work=True)
    raw["peer_version"] = version
    _cpu_rows(table, spec["label"], raw)
    _own_work_row(table, raw)
    if gpu:
        raw["gpu"] = _gpu_row(table, spec, dataset, BATCH[mode], repeats, work)
    return {k: v for k, v in raw.items() if k != "values"}


def model_of(mode: str) -> dict[str, Any]:
    """The network of the mode: vit_small 224 px, or under ``--smoke`` the tiny ViT."""
    if mode == "smoke":
        return {"kind": "tiny", "size": 32, "label": "tiny ViT 32px"}
    return {"kind": "vit_small", "size": 224, "label": "vit_small 224px"}


def _cpu_rows(table: Any, label: str, raw: dict[str, Any]) -> None:
    t, e = raw["timings"], raw["errors"]
    n, batch, groups = raw["images"], raw["batch"], raw["groups"]
    peer_s = t["baseline"]["median_s"]
    where = f"{label}, {n} images, batch {batch}, {len(raw['points'])} block outputs (all tokens)"
    table.add(
        "16.1",
        f"peer ({PEER} {raw['peer_version']}): seconds per observation",
        peer_s,
        "s",
        f"{where}; analyze_model, spectral metrics only, float32 Welford on the CPU; median of {raw['repeats'] + 1}",
    )
    what = {
        "f64": "like for like (G=0, families off), Gram float64",
        "f32": "like for like (G=0, families off), Gram float32",
        "defaults": f"default settings (G={groups}, probes, attention, ...)",
    }
    for row, v in zip(("16.2", "16.3", "16.4"), VARIANTS, strict=True):
        ratio = t[v]["ratio"]
        met = "met" if ratio <= TIME_TARGET else "MISSED"
        goal = f"; target <= {TIME_TARGET:.2f}x {met}" if v != "defaults" else ""
        table.add(
            row,
            f"TGO {what[v]} / peer, seconds per observation",
            ratio,
            "x",
            f"TGO {t[v]['median_s']:.2f} s vs peer {peer_s:.2f} s, median of {raw['repeats']} interleaved{goal}",
            ratios=t[v]["ratios"],
        )
    peer_err = max(e["peer"].values())
    for row, name in zip(("16.5", "16.6", "16.7", "16.8"), ("peer", *VARIANTS), strict=True):
        worst = max(e[name].values())
        detail = _error_text(e[name])
        if name != "peer":
            gain = peer_err / worst if worst > 0 else float("inf")
            met = "met" if gain >= ERROR_TARGET else "MISSED"
            goal = f"; target >= {ERROR_TARGET:,.0f}x {met}" if name == "f64" else ""
            detail += f"; peer / this = {gain:.3g}x{goal}"
        table.add(
            row,
            f"largest relative error vs float64 two-pass, {'peer' if name == 'peer' else 'TGO ' + name}",
            worst,
            "",
            detail,
            text=f"{worst:.2e}",
        )


def _own_work_row(table: Any, raw: dict[str, Any]) -> None:
    """Row 16.10: TGO's own work (like for like, float64) over the peer's, the medians of the interleaved runs'."""
    own = raw["own_work_s"]
    tgo_s, peer_s = statistics.median(own["f64"]), statistics.median(own["peer"])
    table.add(
        OWN_WORK_ROW,
        "own work above the shared forward, TGO like for like (f64 Gram) / peer",
        tgo_s / peer_s,
        "x",
        f"TGO's Gram updates, summary and records {tgo_s:.3f} s vs the peer's Welford updates and metrics "
        f"({PEER} {raw['peer_version']}: float32 product and eigh) {peer_s:.3f} s, medians of the interleaved runs, "
        f"{torch.get_num_threads()} torch threads; where the forward is a smaller share (more cores) row 16.2 tends to "
        "this (docs/benchmarks.md, what row 16.2 is made of)",
    )


def _gpu_row(
    table: Any, spec: dict[str, Any], dataset: TensorDataset, batch: int, repeats: int, work: Path
) -> dict[str, Any]:
    """Row 16.9: like for like, float64 Gram, on the GPU (IEEE float32 forward for both: TF32 off)."""
    if not torch.cuda.is_available():
        table.skip([GPU_PEER_ROW], "GPU: TGO like for like / peer", "no GPU", "torch.cuda.is_available() is False")
        return {"skipped": "no GPU"}
    from tgo.spectral.accumulator import strict_fp32_math

    device = torch.device("cuda", 0)
    net = h.build_model(spec["kind"], device, spec["size"])
    with strict_fp32_math("cuda"):  # the peer's forward as exact as TGO's (cuDNN would run the patch conv in TF32)
        raw = side_by_side(net, dataset, batch, device, repeats, Path(tempfile.mkdtemp(dir=work)))
    t, worst = raw["timings"], {name: max(e.values()) for name, e in raw["errors"].items()}
    table.add(
        GPU_PEER_ROW,
        f"GPU {torch.cuda.get_device_name(0)}: TGO like for like (f64 Gram) / peer, {spec['label']}",
        t["f64"]["ratio"],
        "x",
        f"{raw['images']} images, batch {batch}; TGO {t['f64']['median_s']:.2f} s (f32 Gram "
        f"{t['f32']['ratio']:.3f}x, defaults {t['defaults']['ratio']:.3f}x) vs peer {t['baseline']['median_s']:.2f} s; "
        f"largest errors peer {worst['peer']:.1e}, TGO f64 {worst['f64']:.1e}",
        ratios=t["f64"]["ratios"],
    )
    return {k: v for k, v in raw.items() if k not in ("reference", "values")}


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks._table import run_alone

    return run_alone(argv, "peer_bench", peer_rows, "16 images, 2 repeats", repeats=True)


if __name__ == "__main__":
    raise SystemExit(main())
