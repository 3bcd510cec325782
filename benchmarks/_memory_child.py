"""Memory measurements in a fresh process: ``python -m benchmarks._memory_child MODEL SIZE IMAGES BATCH VARIANT ...``.

MODEL is one of ``_harness.MODEL_KINDS`` (``vit_small``, ``quickstart``, ``tiny``); VARIANT is ``forward`` (plain
inference forward, the floor), ``ours`` (``observe_and_record``, float64 Gram, default settings: ``G`` jackknife
groups), ``ours_g0`` (the same with ``groups=0``: one accumulator per point) or ``naive`` (store every activation,
then torch.cov + eigvalsh). The model and the images are built first; the peak resident memory *above* that state
during the variant is printed as one JSON line (bytes), with the wall time.

The benchmarks start one process per measurement so every peak is clean. Several groups of the five arguments may
follow each other (``--smoke`` does this to pay the interpreter start once); each prints its own line, and later
peaks then sit on whatever the earlier ones left in the heap.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ARGS_PER_MEASUREMENT = 5


def measure(model: str, size: int, images: int, batch: int, variant: str) -> dict[str, Any]:
    """Builds the model and images, then measures one variant's peak RSS above that state."""
    from benchmarks import _harness as h
    from tgo.observatory import vit_points

    device = torch.device("cpu")
    net = h.build_model(model, device, size)
    points = vit_points(net)
    dataset = h.random_images(images, size)
    settings = h.observation_settings("float64")
    settings_g0 = h.observation_settings("float64", groups=0)
    out = Path(tempfile.mkdtemp())
    with torch.inference_mode():
        net(dataset.tensors[0][:2])  # thread pools, allocator, kernels: nothing of the variant yet
    runs = {
        "forward": lambda: h.plain_forward(net, dataset, batch, device),
        "ours": lambda: h.observation(net, dataset, points, batch, device, settings, out),
        "ours_g0": lambda: h.observation(net, dataset, points, batch, device, settings_g0, out),
        "naive": lambda: h.naive_observation(net, dataset, points, batch, device),
    }
    with h.PeakRSS() as mem:
        start = time.perf_counter()
        runs[variant]()
        seconds = time.perf_counter() - start
    return {
        "model": model,
        "size": size,
        "images": images,
        "variant": variant,
        "groups": {"ours": settings.groups, "ours_g0": 0}.get(variant),
        "peak_delta_bytes": mem.peak_delta,
        "baseline_bytes": mem.start,
        "seconds": seconds,
        "method": mem.method,
    }


def main(argv: list[str]) -> None:
    """Measures every ``MODEL SIZE IMAGES BATCH VARIANT`` group in order, one JSON line each."""
    if not argv or len(argv) % ARGS_PER_MEASUREMENT:
        raise SystemExit(f"usage: python -m benchmarks._memory_child MODEL SIZE IMAGES BATCH VARIANT [...]; got {argv}")
    for i in range(0, len(argv), ARGS_PER_MEASUREMENT):
        model, size, images, batch, variant = argv[i : i + ARGS_PER_MEASUREMENT]
        print(json.dumps(measure(model, int(size), int(images), int(batch), variant)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
