"""Rows 13: the cost of one curvature measurement (``observation.curvature``, issue 25 item 3).

``python -m benchmarks.curvature_bench [--quick | --smoke]`` prints the rows; docs/benchmarks.md, rows 13, says what
each measures. A measurement is at most ``2 * lanczos_iterations + trace_probes`` Hessian-vector products (76 at the
defaults), so its cost is ``HVPs x seconds per HVP``: 13.1 extrapolates one timed vit_small HVP to that count (timing
all 76 at 64 images would take hours here), 13.2 counts its FLOPs (``FlopCounterMode``), 13.3 **projects** the H200
seconds from them (`H200_PEAK` x `SUSTAINED`: not a measurement), 13.4-13.5 measure the quickstart network end to end
and against one training epoch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from benchmarks import _harness as h
from benchmarks._table import run_alone

H200_PEAK = {"float64": 67e12, "float32": 67e12}
"""NVIDIA H200 SXM data sheet peaks, dense: FP64 Tensor Core 67 TFLOPS, FP32 67 TFLOPS (TF32 Tensor Core 989
TFLOPS is with sparsity; the HVPs here are IEEE float32 or float64)."""
SUSTAINED = 0.4
"""Assumed fraction of the peak an HVP sustains (small matmuls of one 197-token ViT-S chunk, attention unfused,
autograd's double backward): an assumption, stated in every projected row."""


@dataclass(frozen=True)
class Profile:
    """How much each row measures."""

    name: str
    timed_images: int  # images of the one timed vit_small HVP (13.1)
    vit_small: bool  # False: the smoke run's tiny network stands in
    quickstart: dict[str, Any]  # curvature settings overriding the defaults in 13.4 (smoke: a toy measurement)
    depth: int = 12  # blocks of the quickstart network (smoke: 2)
    epoch_steps: int = math.ceil(1797 / 64)  # training steps of 13.5's epoch


PROFILES = {
    "default": Profile("default", 8, True, {}),
    "quick": Profile("quick", 2, True, {}),
    "smoke": Profile("smoke", 1, False, {"images": 2, "lanczos_iterations": 2, "trace_probes": 2, "top_k": 1}, 1, 1),
}


def _net(name: str, **arch: Any) -> torch.nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model(name, **arch).eval()


def hvp_seconds(net: torch.nn.Module, images: int, size: int, dtype: torch.dtype) -> float:
    """Seconds of one HVP over ``images`` random images (one forward chunk) after one warm-up."""
    from tgo.optimisation.curvature import HessianOperator

    g = torch.Generator().manual_seed(0)
    x = torch.randn(images, 3, size, size, generator=g)
    op = HessianOperator(net, x, torch.arange(images) % 10, dtype=dtype, batch_size=images)
    v = np.random.default_rng(0).standard_normal(op.dim)
    op.matvec(v)
    return h.median_time(lambda: op.matvec(v), 1)


def hvp_flops(net: torch.nn.Module, size: int) -> tuple[float, float]:
    """``(FLOPs of one HVP, FLOPs of one forward)`` for one image (`FlopCounterMode`, float32)."""
    from torch.utils.flop_counter import FlopCounterMode

    from tgo.optimisation.curvature import HessianOperator

    x = torch.randn(1, 3, size, size)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(x)
    forward = float(counter.get_total_flops())
    op = HessianOperator(net, x, torch.zeros(1, dtype=torch.int64), dtype=torch.float32)
    with FlopCounterMode(display=False) as counter:
        op.matvec(np.ones(op.dim))
    return float(counter.get_total_flops()), forward


def max_products(settings: Any) -> int:
    """HVPs of one measurement at most (Adam: both Lanczos runs to their step limit, and the probes)."""
    return 2 * settings.lanczos_iterations + settings.trace_probes


def quickstart_measurement(profile: Profile) -> tuple[float, int, float]:
    """``(seconds, HVPs, epoch seconds)``: one curvature measurement of the quickstart network on an AdamW state at
    the default settings (the profile's overrides), and one quickstart epoch's training compute."""
    from torch.utils.data import TensorDataset

    from tgo.observatory.families import FamilyContext, TrainingInfo
    from tgo.observatory.families.curvature import CurvatureState
    from tgo.observatory.points import vit_points
    from tgo.observatory.settings import ObservationSettings

    net = _net(
        "vit_tiny_patch16_224",
        img_size=16,
        patch_size=4,
        embed_dim=96,
        depth=profile.depth,
        num_heads=3,
        num_classes=10,
    ).train()
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=0.05)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 3, 16, 16, generator=g), torch.arange(64) % 10
    steps = profile.epoch_steps
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y, label_smoothing=0.1).backward()
        opt.step()
    epoch = time.perf_counter() - start
    net.eval()
    settings = ObservationSettings.from_config({"curvature": {"enabled": True, **profile.quickstart}})
    data = TensorDataset(torch.randn(200, 3, 16, 16, generator=g), torch.arange(200) % 10)
    points = tuple(vit_points(net))
    context = FamilyContext(
        net=net,
        points=points,
        modules={},
        settings=settings,
        device=torch.device("cpu"),
        rank=0,
        world_size=1,
        n_images=len(data),
        groups=0,
        group_of_item=np.zeros(len(data), np.int64),
        num_prefix_tokens=1,
        dataset=data,
        training=TrainingInfo(epoch=0, global_step=steps, optimizer=opt, learning_rate=2e-3),
    )
    from tgo.optimisation import curvature as numerics

    with h.timed_calls({"matvec": (numerics.HessianOperator, "matvec")}) as products:
        start = time.perf_counter()
        CurvatureState(context)
        seconds = time.perf_counter() - start
    return seconds, len(products["matvec"]), epoch


def curvature_rows(table: Any, profile_name: str) -> dict[str, Any]:
    """Rows 13.1-13.5 into ``table`` (``add(row, measurement, value, unit, detail)``); returns what was measured."""
    from tgo.observatory.settings import ObservationSettings

    profile = PROFILES[profile_name]
    s = ObservationSettings().curvature
    products = max_products(s)
    if profile.vit_small:
        net, size, label = _net("vit_small_patch16_224", num_classes=10), 224, "vit_small 224 px"
    else:
        net, size, label = (
            _net("vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2),
            16,
            "smoke: 2-block width-32 ViT at 16 px",
        )
    cpu = s.torch_dtype("cpu")
    per_hvp = hvp_seconds(net, profile.timed_images, size, cpu)
    seconds = per_hvp * s.images / profile.timed_images * products
    table.add(
        "13.1",
        f"curvature measurement, {label}, CPU ({str(cpu).removeprefix('torch.')}), extrapolated",
        seconds,
        " s",
        f"one HVP over {profile.timed_images} images {per_hvp:.2f} s x {s.images}/{profile.timed_images} images x "
        f"{products} HVPs (2 x {s.lanczos_iterations} Lanczos steps + {s.trace_probes} probes, at most)",
    )
    hvp, forward = hvp_flops(net, size)
    table.add(
        "13.2",
        f"FLOPs per HVP per image, {label}",
        hvp / 1e9,
        " GFLOP",
        f"{hvp / forward:.2f}x one forward ({forward / 1e9:.2f} GFLOP); FlopCounterMode, 2 FLOPs per multiply-add",
    )
    gpu = s.torch_dtype("cuda")
    rate = H200_PEAK[str(gpu).removeprefix("torch.")] * SUSTAINED
    projected = hvp * s.images * products / rate
    table.add(
        "13.3",
        f"PROJECTED H200 seconds per measurement, {label} ({str(gpu).removeprefix('torch.')})",
        projected,
        " s",
        f"{hvp / 1e9:.1f} GFLOP x {s.images} images x {products} HVPs / ({rate / 1e12:.1f} TFLOP/s: {SUSTAINED:.0%} of "
        f"the data sheet's {H200_PEAK['float64'] / 1e12:.0f} TFLOPS FP64 Tensor Core = FP32 peak); not measured",
    )
    q_seconds, q_products, epoch = quickstart_measurement(profile)
    q_images = profile.quickstart.get("images", s.images)
    table.add(
        "13.4",
        f"curvature measurement, quickstart network ({profile.depth} x 96, 16 px), {q_images} images, AdamW state, "
        f"CPU ({str(cpu).removeprefix('torch.')})",
        q_seconds,
        " s",
        f"{q_products} HVPs measured end to end ({q_seconds / max(q_products, 1):.3f} s each)",
    )
    table.add(
        "13.5",
        "quickstart: one curvature measurement / one training epoch's compute",
        q_seconds / epoch,
        "x",
        f"epoch {epoch:.2f} s ({profile.epoch_steps} steps of forward + backward + AdamW on 64 images at 16 px)",
    )
    return {"vit_small_seconds": seconds, "hvp_flops": hvp, "projected_h200": projected, "quickstart": q_seconds}


if __name__ == "__main__":
    raise SystemExit(
        run_alone(None, "curvature_bench", lambda t, mode, work: curvature_rows(t, mode), "vit_small HVP on 2 images")
    )
