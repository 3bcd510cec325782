"""One memory measurement in a fresh process: ``python -m benchmarks._memory_child MODEL SIZE IMAGES BATCH VARIANT``.

MODEL is ``vit_small`` or ``quickstart``; VARIANT is ``forward`` (plain inference forward, the floor), ``ours``
(``observe_and_record``, float64 Gram) or ``naive`` (store every activation, then torch.cov + eigvalsh). The model and
the images are built first; the peak resident memory *above* that state during the variant is printed as one JSON
line (bytes), with the wall time.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch


def main(argv: list[str]) -> None:
    from benchmarks import _harness as h
    from tgo.observatory import vit_points

    model, size, images, batch, variant = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    device = torch.device("cpu")
    net = h.vit_small(device) if model == "vit_small" else h.quickstart_net(device, img_size=size)
    points = vit_points(net)
    dataset = h.random_images(images, size)
    out = Path(tempfile.mkdtemp())
    with torch.inference_mode():
        net(dataset.tensors[0][:2])  # thread pools, allocator, kernels: nothing of the variant yet
    runs = {
        "forward": lambda: h.plain_forward(net, dataset, batch, device),
        "ours": lambda: h.observation(net, dataset, points, batch, device, torch.float64, out),
        "naive": lambda: h.naive_observation(net, dataset, points, batch, device),
    }
    with h.PeakRSS() as mem:
        start = time.perf_counter()
        runs[variant]()
        seconds = time.perf_counter() - start
    print(json.dumps({"model": model, "size": size, "images": images, "variant": variant,
                      "peak_delta_bytes": mem.peak_delta, "baseline_bytes": mem.start, "seconds": seconds,
                      "method": mem.method}))


if __name__ == "__main__":
    main(sys.argv[1:])
