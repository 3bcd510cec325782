"""What observing costs: ``python -m benchmarks`` (``make bench``; ``make bench ARGS=--quick`` for ~3 minutes).

Prints one table and writes it, with the environment, to ``bench_out/<timestamp>/results.json``. Every figure is a
median or a ratio measured in this one run (see ``benchmarks/_harness.py`` for how timings are interleaved):

1. Observation overhead: ``observe_and_record`` (stream through the 15 hooks, reduce, float64 eigendecomposition,
   observables, records; TensorBoard figures excluded) / a plain inference forward over the same images, for
   ``vit_small_patch16_224`` at 224 px and for the quickstart network on its 200-image analysis subset, float64 and
   float32 Gram. Goal on CPU: <= 1.10x. The phases of the same runs are broken down below it.
2. The naive baseline: every point's activations stored, then ``torch.cov`` + ``eigvalsh``: time ratio and peak memory.
3. Memory scaling: peak resident memory above the loaded model at 64, 256 and 1,000 images, ours and naive, MB/image.
4. Training overhead: share of a quickstart epoch's wall time spent observing with ``every_n_epochs=1``.
5. Eigendecomposition + observables per observation, and TensorBoard figure rendering per observation.
6. GPU rows (only with CUDA): the overhead at 1,000 images, the tgo1-sized observation in seconds, peak GPU memory,
   and the analysis pass under DDP over the GPUs present.

``benchmarks/spectral_bench.py`` (the engine alone) runs first, in its own process, and its output is kept next to the
JSON. No assertions anywhere: this measures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import torch

from benchmarks import _harness as h

GOAL = 1.10
MB = 1024**2


class Table:
    """Rows of ``(row, measurement, value, detail)``; values are formatted strings, raw numbers go to the JSON."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, row: str, measurement: str, value: float | str | None, unit: str = "", detail: str = "",
            **raw: Any) -> None:
        if isinstance(value, str) or value is None:
            text = value or "-"
        elif unit == "x":
            text = f"{value:.3f}x"
        elif unit == "s":
            text = f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
        elif unit == "MB":
            text = f"{value:.1f} MB"
        elif unit == "MB/img":
            text = f"{value:.3f} MB/img"
        elif unit == "%":
            text = f"{value:.1f} %"
        else:
            text = f"{value:.4g} {unit}".strip()
        self.rows.append({"row": row, "measurement": measurement, "value": value, "unit": unit, "text": text,
                          "detail": detail, **raw})
        print(f"  [{row}] {measurement}: {text}  {detail}", flush=True)

    def render(self) -> str:
        w_row = max(len(r["row"]) for r in self.rows)
        w_meas = max(len(r["measurement"]) for r in self.rows)
        w_val = max(len(r["text"]) for r in self.rows)
        lines = [f"{'row':<{w_row}}  {'measurement':<{w_meas}}  {'value':>{w_val}}  detail"]
        lines.append("-" * (len(lines[0]) + 40))
        last = None
        for r in sorted(self.rows, key=lambda r: r["row"].split(".")[0]):  # stable: measurement order within a row
            group = r["row"].split(".")[0]
            if last is not None and group != last:
                lines.append("")
            last = group
            lines.append(f"{r['row']:<{w_row}}  {r['measurement']:<{w_meas}}  {r['text']:>{w_val}}  {r['detail']}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- rows 1, 2, 5a
def overhead(table: Table, label: str, row: str, net: torch.nn.Module, dataset: Any, batch: int,
             device: torch.device, repeats: int, work: Path, *, naive: bool) -> dict[str, Any]:
    """Observation / forward for both Gram dtypes (and the naive baseline, hooks-only), interleaved with forwards."""
    from tgo.observatory import vit_points

    points = vit_points(net)
    timers = {"float64": h.PhaseTimer(), "float32": h.PhaseTimer()}
    last: dict[str, Any] = {}

    def observe(dtype_name: str) -> None:
        with timers[dtype_name].attached():
            last[dtype_name] = h.observation(net, dataset, points, batch, device, getattr(torch, dtype_name), work)
        h.synchronize(device)

    variants = {
        "float64": lambda: observe("float64"),
        "float32": lambda: observe("float32"),
        "hooks only": lambda: h.hooked_noop_forward(net, dataset, points, batch, device),
    }
    if naive:
        variants["naive"] = lambda: (h.naive_observation(net, dataset, points, batch, device), h.synchronize(device))
    baseline = lambda: h.plain_forward(net, dataset, batch, device)  # noqa: E731
    baseline()  # warm-up, then one of each (timers reset so only timed runs count)
    for fn in variants.values():
        fn()
    for timer in timers.values():
        timer.samples = {k: [] for k in timer.PHASES}
    res = h.interleaved(baseline, variants, repeats, warmup=False)
    n = len(dataset)
    forward = res["baseline"]["median_s"]
    where = f"{n} images, batch {batch}, {device.type}"
    table.add(f"{row}.0", f"{label}: plain inference forward", forward, "s",
              f"{where}; {forward / n * 1e3:.1f} ms/image")
    for name in ("float64", "float32"):
        ratio = res[name]["ratio"]
        goal = f"goal <= {GOAL:.2f}x {'met' if ratio <= GOAL else 'MISSED'}" if device.type == "cpu" else ""
        table.add(f"{row}.{1 if name == 'float64' else 2}", f"{label}: observation / forward, Gram {name}", ratio,
                  "x", f"observation {res[name]['median_s']:.2f} s; {goal}", ratios=res[name]["ratios"])
    phases64, phases32 = timers["float64"].medians(), timers["float32"].medians()
    table.add(f"{row}.3", f"{label}: hooks only (no accumulation) / forward", res["hooks only"]["ratio"], "x",
              "15 hooks + exact-fp32 context, updates do nothing")
    for name, phases in (("float64", phases64), ("float32", phases32)):
        fixed = phases.get("reduce", 0) + phases.get("eig_observables", 0) + phases.get("records", 0)
        table.add(f"{row}.{4 if name == 'float64' else 5}", f"{label}: stream (fwd+hooks+Gram) / forward, {name}",
                  phases["stream"] / forward, "x",
                  f"then per observation: reduce {phases.get('reduce', 0):.3f} s, eig+observables "
                  f"{phases.get('eig_observables', 0):.3f} s, records {phases.get('records', 0):.3f} s "
                  f"(= {fixed / forward:.3f}x)", phases=phases)
    if naive:
        table.add("2.1", f"{label}: naive store + torch.cov / forward", res["naive"]["ratio"], "x",
                  f"naive {res['naive']['median_s']:.2f} s; naive / ours (f64) = "
                  f"{res['naive']['median_s'] / res['float64']['median_s']:.2f}x", ratios=res["naive"]["ratios"])
    return {"timings": {k: {kk: vv for kk, vv in v.items()} for k, v in res.items()},
            "phases": {"float64": phases64, "float32": phases32}, "results": last.get("float64")}


# ---------------------------------------------------------------------------------------------------- rows 2, 3
def memory_rows(table: Table, vit_images: int, vit_batch: int, scaling: list[int], qs_batch: int) -> dict[str, Any]:
    """Peak RSS above the loaded model, one fresh process per variant (see `_harness.run_memory_child`)."""
    raw: dict[str, Any] = {}
    peaks = {v: h.run_memory_child(["vit_small", "224", str(vit_images), str(vit_batch), v])
             for v in ("forward", "ours", "naive")}
    raw["vit_small"] = peaks
    mb = {v: p["peak_delta_bytes"] / MB for v, p in peaks.items()}
    table.add("2.2", f"vit_small 224px, {vit_images} images: peak RSS, plain forward", mb["forward"], "MB",
              "the floor: one batch's activations")
    table.add("2.3", f"vit_small 224px, {vit_images} images: peak RSS, ours (f64)", mb["ours"], "MB",
              f"state held: 15 x (384^2+2x384) x 8 B = {15 * (384 * 384 + 768) * 8 / MB:.1f} MB")
    table.add("2.4", f"vit_small 224px, {vit_images} images: peak RSS, naive", mb["naive"], "MB",
              f"naive / ours = {mb['naive'] / max(mb['ours'], 1e-9):.1f}x; method: {peaks['ours']['method']}")
    scale: dict[str, dict[int, float]] = {"ours": {}, "naive": {}}
    for n in scaling:
        for v in ("ours", "naive"):
            res = h.run_memory_child(["quickstart", "24", str(n), str(qs_batch), v])
            scale[v][n] = res["peak_delta_bytes"] / MB
            raw.setdefault("quickstart_scaling", []).append(res)
    lo, hi = min(scaling), max(scaling)
    for v in ("ours", "naive"):
        per_image = (scale[v][hi] - scale[v][lo]) / (hi - lo)
        series = ", ".join(f"{n}: {scale[v][n]:.1f}" for n in scaling)
        table.add(f"3.{1 if v == 'ours' else 2}", f"quickstart net 24px, peak RSS MB/image, {v}", per_image, "MB/img",
                  f"peak MB at {series} images (slope {lo}->{hi})", peaks_mb=scale[v])
    theory = 15 * 37 * 96 * 4 / MB
    table.add("3.3", "quickstart net: naive bytes held by construction", theory, "MB/img",
              "15 points x 37 tokens x 96 floats x 4 B; ours holds 15 x 96^2 x 8 B = 1.1 MB whatever the count")
    return raw


# ---------------------------------------------------------------------------------------------------- row 4
class EpochTimer(L.Callback):
    """Wall-clock stamps at every train epoch start and at train end (kept on the class: Hydra builds the instance)."""

    stamps: list[tuple[str, int, float]] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        EpochTimer.stamps.append(("epoch_start", trainer.current_epoch, time.perf_counter()))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        EpochTimer.stamps.append(("train_end", trainer.current_epoch, time.perf_counter()))


def training_overhead(table: Table, epochs: int, work: Path) -> dict[str, Any]:
    """Quickstart for ``epochs`` full epochs with an observation after every epoch; observing time / epoch time."""
    from callbacks.spectral_geometry import SpectralGeometryCallback
    from tgo.train import run

    calls: list[dict[str, float]] = []
    original = SpectralGeometryCallback.observe

    def timed_observe(self: Any, trainer: Any, pl_module: Any, epoch: int) -> None:
        start = time.perf_counter()
        original(self, trainer, pl_module, epoch)
        calls.append({"epoch": epoch, "seconds": time.perf_counter() - start, "pass": self.last_pass_seconds or 0.0,
                      "logging": self.last_logging_seconds or 0.0})

    EpochTimer.stamps = []
    run_dir = work / "quickstart_run"
    cfg = h.compose_quickstart(run_dir, [
        "callbacks.spectral_geometry.every_n_epochs=1", f"trainer.max_epochs={epochs}",
        "trainer.enable_progress_bar=false", "+callbacks.bench_epoch_timer._target_=benchmarks.observation_bench.EpochTimer",
    ])
    SpectralGeometryCallback.observe = timed_observe
    try:
        run(cfg)
    finally:
        SpectralGeometryCallback.observe = original
    starts = [t for kind, _, t in EpochTimer.stamps if kind == "epoch_start"]
    end = [t for kind, _, t in EpochTimer.stamps if kind == "train_end"][-1]
    bounds = starts + [end]
    by_epoch = {c["epoch"]: c for c in calls}
    per_epoch = []
    for e in range(len(starts)):
        wall = bounds[e + 1] - bounds[e]
        obs = by_epoch.get(e + 1, {"seconds": 0.0, "pass": 0.0, "logging": 0.0})
        per_epoch.append({"epoch": e + 1, "wall_s": wall, "observe_s": obs["seconds"], "pass_s": obs["pass"],
                          "figures_s": obs["logging"]})
    frac = statistics.median(p["observe_s"] / p["wall_s"] for p in per_epoch)
    frac_pass = statistics.median(p["pass_s"] / p["wall_s"] for p in per_epoch)
    wall = statistics.median(p["wall_s"] for p in per_epoch)
    obs_s = statistics.median(p["observe_s"] for p in per_epoch)
    table.add("4.1", "quickstart, every_n_epochs=1: observing / epoch wall time", 100 * frac, "%",
              f"median of {len(per_epoch)} epochs: epoch {wall:.2f} s (train+val+observe+checkpoints), "
              f"observation {obs_s:.2f} s incl. TensorBoard figures")
    table.add("4.2", "quickstart: observation pass only (no figures) / epoch", 100 * frac_pass, "%",
              f"pass {statistics.median(p['pass_s'] for p in per_epoch):.2f} s, figures+scalars "
              f"{statistics.median(p['figures_s'] for p in per_epoch):.2f} s; epoch-0 observation "
              f"{by_epoch.get(0, {}).get('seconds', float('nan')):.2f} s")
    return {"per_epoch": per_epoch, "observations": calls}


# ---------------------------------------------------------------------------------------------------- row 5
def figure_time(results: dict[str, Any], renders: int, work: Path) -> float:
    """Median seconds of ``SpectralGeometryCallback._log_figures`` for one observation (history growing per render)."""
    from torch.utils.tensorboard import SummaryWriter

    from callbacks.spectral_geometry import SpectralGeometryCallback

    cb = SpectralGeometryCallback(every_n_epochs=1)
    cb.last_pass_seconds = 0.0
    no_logger = SimpleNamespace(loggers=[], max_epochs=1000)
    writer = SummaryWriter(str(tempfile.mkdtemp(dir=work)))
    samples = []
    try:
        for epoch in range(renders):
            cb._log_tensorboard(no_logger, epoch, results)  # history + scalars only (no TensorBoard logger)
            start = time.perf_counter()
            cb._log_figures(writer, epoch, results)
            writer.flush()
            samples.append(time.perf_counter() - start)
    finally:
        writer.close()
    return statistics.median(samples)


# ---------------------------------------------------------------------------------------------------- row 6
def _ddp_worker(rank: int, world: int, port: int, images: int, batch: int, out: str) -> None:
    import torch.distributed as dist

    from tgo.observatory import vit_points

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    device = torch.device("cuda", rank)
    try:
        net = h.vit_small(device)
        dataset = h.random_images(images, 224)
        points = vit_points(net)

        def reduce_sum(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t)
            return t

        from tgo.observatory.sharded import RecordPlan, ShardPlan, observe_and_record
        from tgo.records import RecordWriter

        samples = []
        for i in range(3):  # one warm-up, two timed
            dist.barrier()
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            observe_and_record(net, dataset, points, plan=ShardPlan(rank=rank, world_size=world, batch_size=batch),
                               record=RecordPlan(writer=RecordWriter(Path(out).parent / f"ddp_{i}"), epoch=0, step=0),
                               all_reduce_sum=reduce_sum, is_global_zero=rank == 0, device=device)
            torch.cuda.synchronize(device)
            dist.barrier()
            if i:
                samples.append(time.perf_counter() - start)
        if rank == 0:
            Path(out).write_text(json.dumps({"world_size": world, "seconds": samples}))
    finally:
        dist.destroy_process_group()


def gpu_rows(table: Table, images: int, repeats: int, work: Path) -> dict[str, Any]:
    """Row 6: the same measurements on the GPU (vit_small at 224 px, 1,000 images), peak memory and DDP."""
    if not torch.cuda.is_available():
        table.add("6", "GPU rows", "skipped (no GPU)", "", "torch.cuda.is_available() is False")
        return {"skipped": "no GPU"}
    from tgo.observatory import vit_points

    device = torch.device("cuda", 0)
    raw: dict[str, Any] = {}
    net = h.vit_small(device)
    dataset = h.random_images(images, 224)
    batch = 128
    table.add("6.0", "GPU", torch.cuda.get_device_name(0), "", f"{torch.cuda.device_count()} device(s)")
    raw["overhead"] = overhead(table, f"GPU vit_small 224px", "6.1", net, dataset, batch, device, repeats, work,
                               naive=False)
    f64 = raw["overhead"]["timings"]["float64"]["median_s"]
    table.add("6.2", f"GPU: tgo1 observation of {images} images (f64), wall time", f64, "s",
              f"float32 Gram {raw['overhead']['timings']['float32']['median_s']:.2f} s")
    points = vit_points(net)
    mem = {}
    for name, fn in (("forward", lambda: h.plain_forward(net, dataset, batch, device)),
                     ("ours", lambda: h.observation(net, dataset, points, batch, device, torch.float64, work)),
                     ("naive", lambda: h.naive_observation(net, dataset, points, batch, device))):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        mem[name] = {"peak_mb": (torch.cuda.max_memory_allocated(device) - base) / MB,
                     "seconds": time.perf_counter() - start}
    raw["memory"] = mem
    table.add("6.3", f"GPU peak memory above model, {images} images: forward / ours / naive",
              f"{mem['forward']['peak_mb']:.0f} / {mem['ours']['peak_mb']:.0f} / {mem['naive']['peak_mb']:.0f} MB", "",
              f"naive / forward time {mem['naive']['seconds'] / mem['forward']['seconds']:.2f}x (single run)")
    world = torch.cuda.device_count()
    out = work / "ddp.json"
    import torch.multiprocessing as mp

    port = 29500 + os.getpid() % 1000
    mp.spawn(_ddp_worker, args=(world, port, images, batch, str(out)), nprocs=world, join=True)
    ddp = json.loads(out.read_text())
    raw["ddp"] = ddp
    table.add("6.4", f"GPU DDP analysis pass over {world} GPU(s), {images} images (f64)",
              statistics.median(ddp["seconds"]), "s", "NCCL; every image once; one sum all-reduce")
    return raw


# ---------------------------------------------------------------------------------------------------- main
def spectral_engine(quick: bool, out_dir: Path) -> dict[str, Any]:
    """``benchmarks/spectral_bench.py`` in its own process (it fixes glibc's mmap threshold for itself)."""
    cmd = [sys.executable, str(h.REPO / "benchmarks" / "spectral_bench.py"), *(["--quick"] if quick else [])]
    print(f"== spectral engine: {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=h.REPO, capture_output=True, text=True)
    text = proc.stdout + (proc.stderr if proc.returncode else "")
    print(text, flush=True)
    (out_dir / "spectral_bench.txt").write_text(text)
    return {"returncode": proc.returncode, "seconds": time.perf_counter() - start, "output": text}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (about 3 minutes on 2 cores)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench_out/<timestamp>)")
    p.add_argument("--images", type=int, default=None, help="vit_small images for rows 1-2 (CPU default 64, quick 32)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3, quick 2)")
    p.add_argument("--epochs", type=int, default=None, help="quickstart epochs for row 4 (default 2, quick 1)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["spectral", "vit_small", "quickstart", "memory", "training", "figures", "gpu"],
                   help="sections to leave out")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "tgo", "callbacks"):
        logging.getLogger(name).setLevel(logging.ERROR)
    quick = args.quick
    out_dir = args.out or h.REPO / "bench_out" / datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tgo_bench_"))
    vit_images = args.images or (32 if quick else 64)
    repeats = args.repeats or (2 if quick else 3)
    epochs = args.epochs or (1 if quick else 2)
    skip = set(args.skip)
    env = h.environment()
    started = time.perf_counter()
    print(f"TGO benchmarks ({'quick' if quick else 'default'}) -> {out_dir}")
    print(h.environment_line(env), flush=True)
    results: dict[str, Any] = {"environment": env, "quick": quick, "args": vars(args) | {"out": str(out_dir)}}
    table = Table()
    try:
        if "spectral" not in skip:
            results["spectral_bench"] = spectral_engine(quick, out_dir)
        cpu = torch.device("cpu")
        vit_results = qs_results = None
        if "vit_small" not in skip:
            print("== rows 1-2: vit_small_patch16_224 at 224 px (CPU)", flush=True)
            net = h.vit_small(cpu)
            res = overhead(table, "vit_small 224px", "1a", net, h.random_images(vit_images, 224), 32, cpu, repeats,
                           work, naive=True)
            vit_results = res.pop("results")
            results["vit_small"] = res
            del net
        qs_batch = 128
        if "quickstart" not in skip:
            print("== row 1: quickstart network on its analysis subset (CPU)", flush=True)
            dataset, qs_batch = h.quickstart_analysis_images()
            net = h.quickstart_net(cpu)
            res = overhead(table, f"quickstart {len(dataset)} img", "1b", net, dataset, qs_batch, cpu,
                           max(repeats, 3), work, naive=False)
            qs_results = res.pop("results")
            results["quickstart"] = res
            del net
        if "memory" not in skip:
            print("== rows 2-3: peak memory (one process per variant)", flush=True)
            results["memory"] = memory_rows(table, vit_images, 32, [64, 256, 1000], qs_batch)
        if "training" not in skip:
            print(f"== row 4: quickstart training, {epochs} epoch(s), observing every epoch", flush=True)
            results["training"] = training_overhead(table, epochs, work)
        print("== row 5: eigendecomposition and figures per observation", flush=True)
        if "vit_small" in results:
            eig = results["vit_small"]["phases"]["float64"]["eig_observables"]
            table.add("5.1", "eigendecomposition + observables, 15 x 384^2 f64", eig, "s",
                      "per observation: covariance, numpy eigvalsh (1 BLAS thread), 16 observables, from rows 1a")
        if "quickstart" in results:
            eig = results["quickstart"]["phases"]["float64"]["eig_observables"]
            table.add("5.2", "eigendecomposition + observables, 15 x 96^2 f64", eig, "s", "from rows 1b")
        if "figures" not in skip:
            renders = 2 if quick else 3
            for row, label, res in (("5.3", "15 x 384", vit_results), ("5.4", "15 x 96", qs_results)):
                if res is not None:
                    seconds = figure_time(res, renders, work)
                    table.add(row, f"TensorBoard figures per observation, {label}", seconds, "s",
                              f"spectra, histograms, correlation heatmaps, decay, 8 layer x epoch heatmaps; "
                              f"median of {renders}")
        if "gpu" not in skip:
            results["gpu"] = gpu_rows(table, 1000, repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        results["table"] = table.rows
        results["wall_seconds"] = time.perf_counter() - started
        results["load_average_1m_end"] = round(os.getloadavg()[0], 2)
        (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    rendered = table.render()
    (out_dir / "table.txt").write_text(h.environment_line(env) + "\n\n" + rendered + "\n")
    print()
    print(f"TGO observation benchmark - {h.environment_line(env)}")
    print(f"finished in {results['wall_seconds']:.0f} s, load average {results['load_average_1m_end']} at end; "
          f"every value is a median or a ratio measured in this run")
    print(rendered)
    print(f"\nwritten: {out_dir / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
