"""Rows 15: the observation at ViT-B and ViT-L widths (D = 768 and 1,024) on the CPU, and what the memory plan's extra
passes cost (issue 38, item 2); docs/benchmarks.md, rows 15 and the projection built from them.

``python -m benchmarks.width_bench [--quick | --smoke]`` prints the rows alone; ``python -m benchmarks`` runs them with
the rest of the table (``--skip widths`` leaves them out). Each width is measured on a 2-block ViT at 224 px (197
tokens, 5 points, G = 10, the default families), so a CPU run takes minutes: what grows with depth is the forward per
block and the observation's work per point, and the summary is per point, which is what the projection needs.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import _harness as h
from benchmarks._table import run_alone

MB = 10**6  # decimal, as the memory plan (`tgo.observatory.plan.GB`) counts
CLASSES = 2
"""Labels dealt round robin to the random images (the probes' class geometry needs two classes at least)."""


@dataclass(frozen=True)
class Sizes:
    """What rows 15 measure in one mode."""

    widths: tuple[tuple[int, int], ...]  # (D, heads): rows 15.1-15.3 and 15.4-15.6
    image_size: int
    patch: int
    depth: int
    images: int  # >= G = 10: one image per jackknife group at least
    batch: int
    repeats: int  # interleaved (one pass, one point per pass) pairs


SIZES = {
    "default": Sizes(((768, 12), (1024, 16)), 224, 16, 2, 10, 5, 2),
    "quick": Sizes(((768, 12), (1024, 16)), 224, 16, 2, 10, 5, 1),
    "smoke": Sizes(((32, 2), (48, 2)), 32, 8, 2, 10, 5, 1),
}
MODELS = {768: ("vit_base", 12), 1024: ("vit_large", 24)}
"""The timm model each measured width stands for, and its depth (the preset's points: depth + 3)."""


def _net(width: int, heads: int, sizes: Sizes) -> torch.nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(
        img_size=sizes.image_size,
        patch_size=sizes.patch,
        embed_dim=width,
        depth=sizes.depth,
        num_heads=heads,
        num_classes=10,
    ).eval()


def _reduce(net: torch.nn.Module, data: Any, points: list[Any], settings: Any, sizes: Sizes, work: Path) -> Any:
    """One observation's stream and reduction as the callback runs it (identity sum: one process)."""
    from tgo.observatory.pipeline import RecordPlan, ShardPlan, reduce_observation
    from tgo.records import RecordWriter

    return reduce_observation(
        net,
        data,
        points,
        settings=settings,
        plan=ShardPlan(batch_size=sizes.batch),
        record=RecordPlan(RecordWriter(Path(tempfile.mkdtemp(dir=work))), epoch=0, step=0),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )


def _summary(reduced: Any) -> float:
    from tgo.observatory.pipeline import summarize_and_record
    from tgo.observatory.share import SummaryShare

    start = time.perf_counter()
    summarize_and_record(reduced, share=SummaryShare(0, 1, None))
    return time.perf_counter() - start


def measure_width(width: int, heads: int, sizes: Sizes, work: Path) -> dict[str, Any]:
    """Forward, pass (one pass and one point per pass, interleaved), summary and state of one width."""
    from tgo.observatory import ObservationSettings, vit_points
    from tgo.observatory.plan import GB, point_state_bytes

    net, data = _net(width, heads, sizes), h.random_images(sizes.images, sizes.image_size, classes=CLASSES)
    points = vit_points(net)
    settings = ObservationSettings()
    one_point = point_state_bytes(width, settings.groups)
    split = settings.replace(state_budget_gb=one_point * 1.01 / GB)  # one point per pass
    cpu = torch.device("cpu")
    forward = [h.median_time(lambda: h.plain_forward(net, data, sizes.batch, cpu), max(sizes.repeats, 1))]
    reduced = _reduce(net, data, points, settings, sizes, work)  # warm-up, and the cold summary below
    cold = _summary(reduced)
    packed = [int(sum(g.packed_size for g in acc.groups)) * 8 for acc in reduced.accumulators.values()]
    times: dict[str, list[float]] = {"one": [], "split": []}
    passes = 0
    for _ in range(sizes.repeats):
        for name, variant in (("one", settings), ("split", split), ("one", settings)):
            start = time.perf_counter()
            reduced_now = _reduce(net, data, points, variant, sizes, work)
            times[name].append(time.perf_counter() - start)
            if name == "split":
                assert reduced_now.state is not None
                passes = len(reduced_now.state.passes)
            else:
                reduced = reduced_now
            del reduced_now
    warm = _summary(reduced)
    ratios = [s / ((a + b) / 2) for s, a, b in zip(times["split"], times["one"][::2], times["one"][1::2], strict=True)]
    return {
        "width": width,
        "points": len(points),
        "groups": settings.groups,
        "forward_s": forward[0],
        "pass_s": statistics.median(times["one"]),
        "split_pass_s": statistics.median(times["split"]),
        "split_ratio": statistics.median(ratios),
        "split_passes": passes,
        "summary_s": warm,
        "summary_cold_s": cold,
        "point_bytes": one_point,
        "packed_bytes": packed,
    }


def _rows(table: Any, first: str, m: dict[str, Any], sizes: Sizes) -> None:
    from tgo.observatory import ObservationSettings
    from tgo.observatory.plan import GB, point_state_bytes

    budget = ObservationSettings().state_budget_bytes or 0
    d, g, n, p = m["width"], m["groups"], sizes.images, m["points"]
    model, depth = MODELS.get(d, (f"{d}-wide", sizes.depth))
    whole = (depth + 3) * m["point_bytes"]
    per_block = m["forward_s"] / n / sizes.depth
    per_point = max(m["pass_s"] - m["forward_s"], 0.0) / n / p
    label = f"D={d}, {sizes.depth} blocks, {sizes.image_size}px"
    major = first.split(".")[0]
    table.add(
        first,
        f"{label}: observation state per point (peak: held + reduce buffer)",
        m["point_bytes"] / MB,
        "MB",
        f"G x (2 + 2D + D^2 + 2 + D + D^2) x 8 B = {m['point_bytes'] / MB:.1f} MB (packed for the all-reduce, "
        f"measured from the accumulators: {m['packed_bytes'][0] / MB:.1f} MB = G x (2 + D + D^2) x 8 B); {model} "
        f"({depth + 3} points): {whole / GB:.2f} GB peak, {'1 pass' if whole <= budget else 'several passes'} at the "
        f"default {budget / GB:.3g} GB budget; a 40-block D = 1,536 model: "
        f"{43 * point_state_bytes(1536, g) / GB:.1f} GB",
        text=f"{m['point_bytes'] / MB:.1f} MB",
        **{k: m[k] for k in ("point_bytes", "packed_bytes")},
    )
    table.add(
        f"{major}.{int(first.split('.')[1]) + 1}",
        f"{label}: pass (stream + reduce) per image, 1 process",
        m["pass_s"] / n,
        "s",
        f"pass {m['pass_s']:.2f} s over {n} img (batch {sizes.batch}, {p} points, G = {g}, default families) = "
        f"plain forward {m['forward_s']:.2f} s ({per_block * 1e3:.1f} ms per block per image) + the observation "
        f"{per_point * 1e3:.1f} ms per point per image (hooks, grouped float64 Gram, families, reduce)",
        text=f"{m['pass_s'] / n * 1e3:.0f} ms/img",
        forward_per_block_image_s=per_block,
        observation_per_point_image_s=per_point,
        **{k: m[k] for k in ("forward_s", "pass_s")},
    )
    table.add(
        f"{major}.{int(first.split('.')[1]) + 2}",
        f"{label}: rank-0 summary per point",
        m["summary_s"] / p,
        "s",
        f"summarize_and_record of {p} points (G + 1 eigendecompositions per view, probes, records), noise cache "
        f"warm: {m['summary_s']:.2f} s, {m['summary_s'] / n:.2f} s per image at {n} img; cold (first observation "
        f"of a run): {m['summary_cold_s']:.2f} s",
        text=f"{m['summary_s'] / p:.2f} s/point",
        **{k: m[k] for k in ("summary_s", "summary_cold_s")},
    )


def width_rows(table: Any, mode: str, work: Path | None = None) -> dict[str, Any]:
    """Rows 15.1-15.7 of ``mode`` (`SIZES`) into ``table``, each width's rows as soon as it is measured (15.7 from the
    first width's runs), scratch files under ``work`` (``None``: a temporary folder)."""
    sizes = SIZES[mode]
    scratch = Path(tempfile.mkdtemp(prefix="tgo_widths_", dir=work))
    measured = []
    for first, (d, heads) in zip(("15.1", "15.4"), sizes.widths, strict=True):
        measured.append(measure_width(d, heads, sizes, scratch))
        _rows(table, first, measured[-1], sizes)
        if first == "15.1":
            passes_row(table, measured[-1], sizes)
    rows = projection(measured)
    print(f"projection (docs/benchmarks.md, rows 15):\n{projection_markdown(rows)}", flush=True)
    return {"sizes": sizes.__dict__, "widths": measured, "projection": rows}


def passes_row(table: Any, m: dict[str, Any], sizes: Sizes) -> None:
    """Row 15.7: one point per pass against one pass, from `measure_width`'s interleaved runs."""
    extra = max(m["split_pass_s"] - m["pass_s"], 0.0) / max(m["split_passes"] - 1, 1)
    table.add(
        "15.7",
        f"D={m['width']}: the memory plan's extra passes, {m['split_passes']} passes (one point each) / 1 pass",
        m["split_ratio"],
        "x",
        f"the same observation under a budget of one point's state: {m['split_pass_s']:.2f} s against "
        f"{m['pass_s']:.2f} s, median of {sizes.repeats} interleaved pairs; each extra pass costs "
        f"{extra:.2f} s = {extra / m['forward_s']:.2f} x the plain forward over the same images (the Gram work is "
        f"the same; records bitwise equal: tests/observatory/test_plan.py)",
        split_pass_s=m["split_pass_s"],
        extra_pass_s=extra,
    )


# ---------------------------------------------------------------------------------------------------- projection
H100_FP32_TFLOPS = 67.0
"""H100 SXM peak without tensor cores: the observation's forward runs IEEE float32 (TF32 off, `strict_fp32_math`)."""
H100_FP64_TFLOPS = 67.0
"""H100 SXM FP64 tensor-core peak: the float64 Gram is a DGEMM."""
EFFICIENCY = 0.5
"""Fraction of those peaks assumed achieved (an assumption, not measured: no GPU was lent to this task)."""
BUS_GB_S = {8: 300.0, 64: 50.0}
"""NCCL all-reduce bus bandwidth assumed: one 8-GPU NVLink node; 8 such nodes over 400 Gb/s per GPU InfiniBand."""
CORES_PER_RANK = 8
"""Host cores per GPU for the summary's pool (an assumption, as in the H200 projection)."""
PROJECTED = (
    ("vit_base/16", 768, 12, 197),
    ("vit_large/16", 1024, 24, 197),
    ("vit_huge/14", 1280, 32, 257),
    ("40 x 1,536 /14", 1536, 40, 257),
)
"""(model, D, blocks, tokens at 224 px) of the projection; MLP ratio 4, the ViT preset's blocks + 3 points."""


def _forward_flops(width: int, tokens: int) -> float:
    """One block, one image: qkv, projection, MLP (24 T D^2) and the attention products (4 T^2 D)."""
    return 24.0 * tokens * width**2 + 4.0 * tokens**2 * width


def projection(measured: list[dict[str, Any]], images: int = 1000, groups: int = 10) -> list[dict[str, Any]]:
    """One observation of ``images`` analysis images per model and world size (8 and 64 H100s), from rows 15's parts.

    Exact: the state, the passes at the default budget, the reduced bytes. Measured here: the CPU summary per point
    at the measured widths (scaled as D^3 beyond) and the extra pass's cost over a forward (15.7). Projected: the
    stream from FLOPs at `EFFICIENCY` of the peaks, the all-reduce from `BUS_GB_S`, the summary's cores."""
    from tgo.observatory import ObservationSettings
    from tgo.observatory.plan import plan_passes, point_state_bytes
    from tgo.observatory.points import ObservationPoint

    budget = ObservationSettings().state_budget_bytes
    by_width = {m["width"]: m for m in measured}
    widest = max(by_width)
    extra_ratio = measured[0]["split_ratio"] - 1.0
    extra_per_pass = (measured[0]["split_pass_s"] - measured[0]["pass_s"]) / max(measured[0]["split_passes"] - 1, 1)
    extra_per_forward = extra_per_pass / measured[0]["forward_s"] if extra_ratio > 0 else 1.0
    rows = []
    for model, d, blocks, tokens in PROJECTED:
        n_points = blocks + 3
        points = [ObservationPoint(f"p{i}", f"m{i}") for i in range(n_points)]
        plan = plan_passes(points, {p.name: d for p in points}, groups=groups, budget_bytes=budget)
        summary_point = (
            by_width[d]["summary_s"] / by_width[d]["points"]
            if d in by_width
            else by_width[widest]["summary_s"] / by_width[widest]["points"] * (d / widest) ** 3
        )
        vectors = images * (3 * (blocks + 1) + 2) * d * 8  # the probes' per-image vectors (float64, every rank)
        state = n_points * groups * (2 + d + d * d) * 8
        for world in (8, 64):
            shard = math.ceil(images / world)
            forward = shard * blocks * _forward_flops(d, tokens) / (H100_FP32_TFLOPS * 1e12 * EFFICIENCY)
            gram = shard * n_points * 2.0 * tokens * d * d / (H100_FP64_TFLOPS * 1e12 * EFFICIENCY)
            extra = (len(plan.passes) - 1) * extra_per_forward * forward
            reduce = 2 * (world - 1) / world * (state + vectors) / (BUS_GB_S[world] * 1e9)
            per_rank_points = math.ceil(n_points / world)
            rounds = math.ceil(per_rank_points / CORES_PER_RANK)
            rows.append(
                {
                    "model": model,
                    "width": d,
                    "points": n_points,
                    "world": world,
                    "peak_state_gb": n_points * point_state_bytes(d, groups) / 1e9,
                    "passes": len(plan.passes),
                    "vectors_gb": vectors / 1e9,
                    "reduce_gb": (state + vectors) / 1e9,
                    "stream_s": forward + gram + extra,
                    "extra_pass_s": extra,
                    "reduce_s": reduce,
                    "summary_rank_s": rounds * summary_point,
                    "summary_point_cpu_s": summary_point,
                }
            )
    return rows


def projection_markdown(rows: list[dict[str, Any]]) -> str:
    """`projection` as the docs/benchmarks.md table."""
    lines = [
        "| model | H100s | points | peak state / rank | passes (8 GB) | per-image vectors / rank | all-reduce | "
        "stream / rank | of it extra passes | reduce | summary / rank (background) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['world']} | {r['points']} | {r['peak_state_gb']:.2f} GB | {r['passes']} | "
            f"{r['vectors_gb']:.2f} GB | {r['reduce_gb']:.2f} GB | {r['stream_s'] * 1e3:.0f} ms | "
            f"{r['extra_pass_s'] * 1e3:.0f} ms | {r['reduce_s'] * 1e3:.0f} ms | ~{r['summary_rank_s']:.0f} s |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(run_alone(None, "width_bench", width_rows, "D = 768 and 1,024 with one interleaved pair"))
