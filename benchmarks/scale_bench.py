"""Rows 11: observation at cluster scale (issue 24, items 2, 3 and 5's inputs); docs/benchmarks.md, rows 11.

``python -m benchmarks.scale_bench [--quick | --smoke]`` prints the rows alone; ``python -m benchmarks`` runs them
with the rest of the table (``--skip scale`` leaves them out). 11.1-11.2 time the summary off the training path in a
real short fit (`_timed_callback`); 11.3-11.5 the summary shared by W gloo ranks on this machine (`shared_summary`,
with ``LOCAL_WORLD_SIZE=W`` as torchrun sets it, so each rank's pool takes its share of the cores: what carries over
to W machines is the per-rank CPU share and the gather's seconds and bytes); 11.6-11.8 the inputs of a cluster
projection.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from benchmarks import _harness as h
from benchmarks._table import run_alone

BLOCKING_TARGET = 1.15
"""Target of row 11.1: ``geometry/blocking_seconds`` / ``geometry/pass_seconds`` with the summary in the background."""
PROBE_CLASSES = 10
"""Labels dealt round robin to the random images (the probes' class geometry needs classes)."""
MB = 1024**2
SHARE_TIMEOUT_S = 900
"""The gloo timeout of the W-process runs: a lost rank fails the row instead of hanging the benchmark."""


@dataclass(frozen=True)
class Sizes:
    """What rows 11 measure in one mode."""

    kind: str  # the network (`_harness.build_model`): vit_small (D = 384), tiny for --smoke
    image_size: int
    images: int  # analysis images of every observation
    batch: int  # images per observation forward
    train_batch: int
    epochs: int  # of the fits (observations at 0 .. epochs)
    # 11.1's fit: enough for the summary to finish in the epoch (11.2's trains one batch: its summary is inline)
    background_batches: int
    figures: bool  # the configured figures (False: every kind off, --smoke)
    worlds: tuple[int, ...]  # the W of rows 11.3-11.4
    repeats: int  # timed summaries per variant in the W-process runs (after one warm-up each)


SIZES = {
    "default": Sizes("vit_small", 224, 64, 32, 2, 3, 10, True, (2, 3), 3),
    "quick": Sizes("vit_small", 224, 32, 32, 2, 2, 8, True, (2, 3), 2),
    "smoke": Sizes("tiny", 32, 10, 4, 2, 1, 2, False, (2,), 1),  # >= G = 10 images
}
"""Rows 1a's image counts (64, quick 32) at vit_small; ``--smoke`` a 2-block width-32 ViT in seconds (its numbers
mean nothing)."""


def _label(sizes: Sizes) -> str:
    return f"{sizes.kind} {sizes.image_size}px"


def _settings(sizes: Sizes, background: bool) -> dict[str, Any]:
    """The callback's observation settings: the defaults, every epoch, the observation batch, ``background``."""
    settings: dict[str, Any] = {
        "every_n_epochs": 1,
        "batch_size": sizes.batch,
        "summary": {"background": background},
    }
    if not sizes.figures:
        settings["figures"] = h.figures_off()
    return settings


# ---------------------------------------------------------------------------------------------------- rows 11.1-11.2
def _timed_callback(settings: dict[str, Any], analysis: Any) -> Any:
    """The real callback, its hooks stamped: observations, summary collections (where and how long), batches."""
    from tgo.callbacks.spectral_geometry import SpectralGeometryCallback

    class TimedGeometry(SpectralGeometryCallback):
        def __init__(self) -> None:
            super().__init__(settings, analysis=analysis)
            self.stamps: dict[str, list[dict[str, Any]]] = {"observations": [], "collects": [], "batches": []}
            self._where = "batch end"
            self._batch: tuple[float, bool] = (0.0, False)

        def observe_epoch(self, trainer: Any, pl_module: Any, epoch: int) -> None:
            self._where = "next observation"
            start = time.perf_counter()
            super().observe_epoch(trainer, pl_module, epoch)
            wall = time.perf_counter() - start
            self._where = "batch end"
            inline = not self.settings.summary.background
            self.stamps["observations"].append(
                {
                    "epoch": epoch,
                    "pass_s": self.last_pass_seconds,
                    "blocking_s": self.last_blocking_seconds,
                    "observe_wall_s": wall,
                    "summary_s": self.last_summary_seconds if inline else None,
                    "logging_s": self.last_logging_seconds if inline else None,
                }
            )

        def collect_summary(self, trainer: Any, timeout: float | None = None) -> bool:
            pending = self._summaries.pending
            start = time.perf_counter()
            collected = super().collect_summary(trainer, timeout)
            if collected and pending is not None:
                self.stamps["collects"].append(
                    {
                        "epoch": pending.epoch,
                        "where": self._where,
                        "training_thread_s": time.perf_counter() - start,
                        "summary_s": self.last_summary_seconds,
                        "logging_s": self.last_logging_seconds,
                    }
                )
            return collected

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            busy = self._summaries.pending is not None and not self._summaries.done
            self._batch = (time.perf_counter(), busy)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            start, busy = self._batch
            self.stamps["batches"].append({"seconds": time.perf_counter() - start, "summary_in_flight": busy})
            super().on_train_batch_end(trainer, pl_module, *args)

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            self._where = "fit end"
            super().on_fit_end(trainer, pl_module)

    return TimedGeometry()


def callback_fit(sizes: Sizes, background: bool, work: Path) -> dict[str, Any]:
    """One short fit with the timed callback; its stamps, the stream / reduce split of every pass, the fit's wall."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.data import DataLoader

    from tgo.callbacks.dashboard import TensorBoardDashboard
    from tgo.observatory import pipeline

    root = Path(tempfile.mkdtemp(prefix=f"fit_{'bg' if background else 'inline'}_", dir=work))
    batches = sizes.background_batches if background else 1
    analysis = h.random_images(sizes.images, sizes.image_size, seed=1, classes=PROBE_CLASSES)
    train = h.random_images(sizes.train_batch * batches, sizes.image_size, seed=2, classes=PROBE_CLASSES)
    callback = _timed_callback(_settings(sizes, background), analysis)
    trainer = L.Trainer(
        max_epochs=sizes.epochs,
        default_root_dir=root,
        callbacks=[callback],
        accelerator="cpu",
        devices=1,
        logger=TensorBoardLogger(root, name="tb"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=batches,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    net = h.build_model(sizes.kind, "cpu", sizes.image_size)  # the callback finds its one timm ViT
    module = h.classifier(net, lambda parameters: torch.optim.SGD(parameters, lr=1e-3))
    start = time.perf_counter()
    phases = {
        "stream": (pipeline, "stream_activations"),
        "reduce": (pipeline, "reduce_accumulators"),
        "figure_submit": (TensorBoardDashboard, "submit_figures"),  # the hand-off: waits while 2 are in flight
    }
    with h.timed_calls(phases) as split:
        trainer.fit(module, DataLoader(train, batch_size=sizes.train_batch, shuffle=False))
    return {
        "background": background,
        "fit_s": time.perf_counter() - start,
        "train_batches_per_epoch": batches,
        "stream_s": split["stream"],
        "reduce_s": split["reduce"],
        "figure_submit_s": split["figure_submit"],
        **callback.stamps,
    }


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _warm(observations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The observations after epoch 0 (epoch 0's summary also computes the noise baselines), else all."""
    return [o for o in observations if o["epoch"] > 0] or observations


def blocking_rows(table: Any, sizes: Sizes, work: Path) -> dict[str, Any]:
    """Rows 11.1 (``summary.background=true``) and 11.2 (``false``)."""
    out: dict[str, Any] = {}
    for row, background in (("11.1", True), ("11.2", False)):
        fit = callback_fit(sizes, background, work)
        warm = _warm(fit["observations"])
        ratios = [o["blocking_s"] / o["pass_s"] for o in warm]
        ratio = _median(ratios)
        blocking, pass_s = _median([o["blocking_s"] for o in warm]), _median([o["pass_s"] for o in warm])
        n = len(fit["observations"])
        stream = _median(fit["stream_s"][-len(warm) :])
        reduce = _median(fit["reduce_s"][-len(warm) :])
        submits = fit["figure_submit_s"]
        handoff = (
            f"of which the figure hand-off {_median(submits):.2f} s, worst {max(submits):.2f} s: it waits while "
            f"2 observations' figures are in flight"
            if submits
            else "no figures"
        )
        where = (
            f"{_label(sizes)}, {sizes.images} img (batch {sizes.batch}), G=10, probes on, figures "
            f"{'as configured' if sizes.figures else 'off'}; {n} observations in a {fit['fit_s']:.0f} s fit"
        )
        head = (
            f"median of {len(warm)} after epoch 0 (worst {max(ratios, default=float('nan')):.3f}x): blocking "
            f"{blocking:.2f} s vs pass {pass_s:.2f} s (stream {stream:.2f} + reduce {reduce:.3f} s)"
        )
        if background:
            met = "met" if ratio <= BLOCKING_TARGET else "MISSED"
            collects = fit["collects"]
            summary = _median([c["summary_s"] for c in _warm(collects) if c["summary_s"] is not None])
            logging_s = _median([c["logging_s"] or 0.0 for c in collects])
            waited = ", ".join(
                f"{c['training_thread_s']:.2f} s for epoch {c['epoch']}'s"
                for c in collects
                if c["where"] == "next observation"
            )
            busy = [b["seconds"] for b in fit["batches"] if b["summary_in_flight"]]
            idle = [b["seconds"] for b in fit["batches"] if not b["summary_in_flight"]]
            places = ", ".join(
                f"{sum(c['where'] == w for c in collects)} at {w}" for w in ("batch end", "next observation", "fit end")
            )
            detail = (
                f"target <= {BLOCKING_TARGET:.2f}x {met}; {head}; summary {summary:.2f} s after epoch 0 on the "
                f"background thread "
                f"(collected {places}; the next observation waited {waited or 'never'}, outside blocking_seconds, "
                f"epoch 0's computing the noise baselines); at collection the training thread logs scalars + hands off "
                f"figures: {logging_s:.2f} s ({handoff}; outside blocking_seconds); training step "
                f"{_median(busy):.2f} s with a "
                f"summary in flight ({len(busy)}) vs {_median(idle):.2f} s without ({len(idle)}; "
                f"{(_median(busy) - _median(idle)) * len(busy):+.1f} s of training in the fit), batch "
                f"{sizes.train_batch}; {where}"
            )
            measurement = "callback in a fit, summary.background=true: blocking / pass"
        else:
            summary = _median([o["summary_s"] or 0.0 for o in warm])
            logging_s = _median([o["logging_s"] or 0.0 for o in warm])
            detail = (
                f"contrast for 11.1; {head}; blocking = pass + summary and records {summary:.2f} s + scalars and "
                f"figure hand-off {logging_s:.2f} s ({handoff}); {where}"
            )
            measurement = "callback in a fit, summary.background=false: blocking / pass"
        table.add(row, f"{_label(sizes)}: {measurement}", ratio, "x", detail, ratios=ratios, fit=fit)
        out[row] = fit
    return out


# ---------------------------------------------------------------------------------------------------- rows 11.3-11.5
def _share_worker(rank: int, world: int, port: int, out: str, spec: dict[str, Any]) -> None:
    """One rank of a W-process run (``torch.multiprocessing.spawn``): its timings to ``out/rank<r>.json``."""
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(int(spec["threads"]))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=SHARE_TIMEOUT_S))
    try:
        result = _share_rank(rank, world, Path(out), spec)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def _share_rank(rank: int, world: int, out: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Stream this rank's shard, all-reduce, then the one-process (rank 0) and the shared summary, interleaved."""
    import torch.distributed as dist

    from tgo.observatory import RecordPlan, ShardPlan, vit_points
    from tgo.observatory import share as share_module
    from tgo.observatory.pipeline import reduce_observation, summarize_and_record
    from tgo.observatory.results import summary_workers
    from tgo.observatory.share import SummaryShare, deal_points, point_cost, process_group_gather
    from tgo.records import RecordWriter

    group = dist.new_group(backend="gloo")
    net = h.build_model(spec["kind"], "cpu", spec["image_size"], seed=0)
    dataset = h.random_images(spec["images"], spec["image_size"], seed=1, classes=PROBE_CLASSES)
    points = vit_points(net)
    settings = h.observation_settings()
    collectives: list[int] = []

    def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
        collectives.append(t.numel() * t.element_size())
        dist.all_reduce(t)
        return t

    writers = {"alone": RecordWriter(out / "alone"), "shared": RecordWriter(out / "shared")}
    start = time.perf_counter()
    reduced = reduce_observation(
        net,
        dataset,
        points,
        settings=settings,
        plan=ShardPlan(rank=rank, world_size=world, batch_size=spec["batch"]),
        record=RecordPlan(writers["shared"], epoch=0, step=0),
        all_reduce_sum=all_reduce_sum,
        is_global_zero=rank == 0,
    )
    pass_s = time.perf_counter() - start
    summables = {
        run.family.name: 8 * sum(int(s.packed_size) for s in run.state.summables()) for run in reduced.families
    }
    dealt = deal_points({p.name: point_cost(reduced.accumulators[p.name]) for p in points}, world)[rank]

    gathers: list[dict[str, Any]] = []
    gather_bytes = process_group_gather(group)

    def gather(payload: bytes) -> list[bytes] | None:
        t0 = time.perf_counter()
        dist.barrier(group=group)  # the wait for the slowest share, apart from the gather itself
        t1 = time.perf_counter()
        got = gather_bytes(payload)
        gathers.append(
            {
                "wait_s": t1 - t0,
                "gather_s": time.perf_counter() - t1,
                "payload_bytes": len(payload),
                "received_bytes": [len(g) for g in got] if got is not None else None,
            }
        )
        return got

    composition: dict[str, int] = {}

    def composed(_: str, encode: Callable[..., bytes]) -> Callable[..., bytes]:
        def encoded(results: Any, **kwargs: Any) -> bytes:  # what the share holds, by kind of array (sum of nbytes)
            composition.clear()
            composition.update(_composition(results))
            return encode(results, **kwargs)

        return encoded

    phases = {
        "own": (share_module, "summarize_accumulators"),
        "encode": (share_module, "encode_results"),
        "decode": (share_module, "decode_results"),
        "relate": (share_module, "relate_histories"),
        "records": (RecordWriter, "write_observation"),
    }
    runs: list[dict[str, Any]] = []
    encoding = h.patched({"encode": (share_module, "encode_results")}, composed)
    with encoding, h.timed_calls(phases, cpu=True) as samples:
        for epoch in range(int(spec["repeats"]) + 1):  # epoch 0: warm-up (noise caches), no history yet
            order = ("alone", "shared") if epoch % 2 == 0 else ("shared", "alone")
            for variant in order:
                for values in samples.values():
                    values.clear()
                gathers.clear()
                dist.barrier(group=group)
                if variant == "alone" and rank != 0:
                    continue
                # The shared summary as torchrun launches W ranks on one node (LOCAL_WORLD_SIZE=W: each rank's pool
                # takes its share of the cores); the one-process summary as a lone process, every core.
                if variant == "shared":
                    os.environ["LOCAL_WORLD_SIZE"] = str(world)
                else:
                    os.environ.pop("LOCAL_WORLD_SIZE", None)
                pool = summary_workers(len(points))  # the summary pool's threads, as summarize_accumulators sizes it
                record = RecordPlan(writers[variant], epoch=epoch, step=epoch)
                share = SummaryShare(0, 1) if variant == "alone" else SummaryShare(rank, world, gather)
                wall, cpu = time.perf_counter(), time.process_time()
                summarize_and_record(dataclasses.replace(reduced, record=record), share=share)
                runs.append(
                    {
                        "epoch": epoch,
                        "variant": variant,
                        "wall_s": time.perf_counter() - wall,
                        "cpu_s": time.process_time() - cpu,
                        "phases": {name: [list(s) for s in values] for name, values in samples.items()},
                        "gather": dict(gathers[0]) if gathers else None,
                        "pool_threads": pool,
                    }
                )
    dist.barrier(group=group)
    return {
        "rank": rank,
        "world": world,
        "images": len(range(rank, int(spec["images"]), world)),
        "payload_composition": composition,
        "points": dealt,
        "n_points": len(points),
        "dim": int(next(iter(reduced.accumulators.values())).dim),
        "pass_s": pass_s,
        "collective_bytes": collectives,
        "summable_bytes": summables,
        "runs": runs,
    }


def _composition(results: Any) -> dict[str, int]:
    """Bytes of the arrays a share carries, by kind: every view's covariance and mean, spectra, the rest."""
    out = {"covariance": 0, "mean": 0, "eigenvalues": 0, "arrays": 0, "kept_arrays": 0, "jackknife": 0}
    for result in results.values():
        if result.alias_of is None:
            out["covariance"] += int(result.covariance.nbytes)
            out["mean"] += int(result.mean.nbytes)
            out["eigenvalues"] += int(result.spectrum.eigenvalues.nbytes)
        for kind in ("arrays", "kept_arrays", "jackknife"):
            out[kind] += sum(int(getattr(a, "nbytes", 0)) for a in getattr(result, kind).values())
    return out


def shared_summary(sizes: Sizes, world: int, work: Path) -> list[dict[str, Any]]:
    """A W-process run (`_share_worker`); every rank's result, in rank order."""
    import torch.multiprocessing as mp

    out = Path(tempfile.mkdtemp(prefix=f"share_w{world}_", dir=work))
    spec = {
        "kind": sizes.kind,
        "image_size": sizes.image_size,
        "images": sizes.images,
        "batch": sizes.batch,
        "repeats": sizes.repeats,
        "threads": max(1, torch.get_num_threads() // world),  # the stream's threads: the cores split over the ranks
    }
    mp.spawn(_share_worker, args=(world, h.free_port(), str(out), spec), nprocs=world, join=True)
    return [json.loads((out / f"rank{rank}.json").read_text(encoding="utf-8")) for rank in range(world)]


def _timed(ranks: list[dict[str, Any]], rank: int, variant: str) -> list[dict[str, Any]]:
    """The timed runs (epoch >= 1) of one rank and variant, in epoch order."""
    return [r for r in ranks[rank]["runs"] if r["variant"] == variant and r["epoch"] > 0]


def _phase(run: dict[str, Any], name: str, index: int = 0) -> float:
    """Seconds (``index`` 0 wall, 1 CPU) of one phase in one run, summed over its calls."""
    return sum(s[index] for s in run["phases"][name])


def share_summary(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of rows 11.3-11.7 from one W-process run."""
    world = len(ranks)
    alone = _timed(ranks, 0, "alone")
    shared = [_timed(ranks, r, "shared") for r in range(world)]
    pairs = [a["wall_s"] / s["wall_s"] for a, s in zip(alone, shared[0], strict=True)]
    alone_wall = _median([a["wall_s"] for a in alone])
    alone_cpu = _median([a["cpu_s"] for a in alone])
    alone_own = _median([_phase(a, "own") for a in alone])
    alone_own_cpu = _median([_phase(a, "own", 1) for a in alone])
    per_rank = []
    for rank, runs in enumerate(shared):
        own_cpu = _median([_phase(r, "own", 1) for r in runs])
        per_rank.append(
            {
                "rank": rank,
                "points": len(ranks[rank]["points"]),
                "own_s": _median([_phase(r, "own") for r in runs]),
                "own_cpu_s": own_cpu,
                "cpu_share": own_cpu / alone_own_cpu if alone_own_cpu else float("nan"),
                "encode_s": _median([_phase(r, "encode") for r in runs]),
                "wait_s": _median([r["gather"]["wait_s"] for r in runs]),
                "gather_s": _median([r["gather"]["gather_s"] for r in runs]),
                "payload_bytes": _median([r["gather"]["payload_bytes"] for r in runs]),
                "wall_s": _median([r["wall_s"] for r in runs]),
            }
        )
    received = shared[0][-1]["gather"]["received_bytes"] if shared[0] else []
    rank0 = shared[0]
    return {
        "world": world,
        "dim": ranks[0]["dim"],
        "n_points": ranks[0]["n_points"],
        "speedup": _median(pairs),
        "speedups": pairs,
        "alone_wall_s": alone_wall,
        "alone_cpu_s": alone_cpu,
        "alone_own_s": alone_own,
        "alone_own_cpu_s": alone_own_cpu,
        "alone_records_s": _median([_phase(a, "records") for a in alone]),
        "shared_wall_s": _median([r["wall_s"] for r in rank0]),
        "decode_s": _median([_phase(r, "decode") for r in rank0]),
        "relate_s": _median([_phase(r, "relate") for r in rank0]),
        "records_s": _median([_phase(r, "records") for r in rank0]),
        "per_rank": per_rank,
        "gathered_payload_bytes": sum(received),
        "gather_wire_bytes": (world - 1) * max(received, default=0),
        "max_own_cpu_share": max(p["cpu_share"] for p in per_rank),
        "estimated_rank_s": alone_own * max(p["cpu_share"] for p in per_rank),
        "collective_bytes": ranks[0]["collective_bytes"],
        "summable_bytes": ranks[0]["summable_bytes"],
        "pass_s": [r["pass_s"] for r in ranks],
        "rank_images": [r["images"] for r in ranks],
        "payload_composition": [r["payload_composition"] for r in ranks[1:]],
        "repeats": len(pairs),
        "alone_pool_threads": alone[0]["pool_threads"] if alone else None,
        "shared_pool_threads": rank0[0]["pool_threads"] if rank0 else None,
    }


def _cores_text(s: dict[str, Any], world: int, cores: int) -> str:
    """How the summary pools sat on the cores, and so what the wall ratio means."""
    alone, shared = s["alone_pool_threads"], s["shared_pool_threads"]
    if alone is None or shared is None:
        return f"{world} processes on {cores} cores"
    pools = (
        f"summary pools: one process {alone} threads, shared {shared} per rank x {world} ranks "
        f"(LOCAL_WORLD_SIZE={world}, as torchrun on one node) on {cores} cores"
    )
    if shared * world > cores:
        return f"{pools}: oversubscribed, the wall ratio says little; the CPU share is what W machines would each do"
    return (
        f"{pools}: the same cores as the one process, so the wall ratio is the sharing's cost (ideal 1.0x); the CPU "
        "share is what W machines would each do"
    )


def _payloads_text(s: dict[str, Any]) -> str:
    sizes = ", ".join(f"{p['payload_bytes'] / MB:.2f}" for p in s["per_rank"][1:])
    covariance = sum(c.get("covariance", 0) for c in s["payload_composition"])
    arrays = sum(sum(c.values()) for c in s["payload_composition"])
    return f"{sizes} MB (arrays {arrays / MB:.2f} MB, of which every view's D x D covariance {covariance / MB:.2f} MB)"


def _ranks_text(s: dict[str, Any]) -> str:
    return "; ".join(
        f"r{p['rank']} {p['points']} pts: own {p['own_s']:.2f} s wall / {p['own_cpu_s']:.2f} s CPU "
        f"(= {p['cpu_share']:.2f} of the one-process CPU), encode {p['encode_s']:.3f} s, waits {p['wait_s']:.2f} s"
        for p in s["per_rank"]
    )


def share_rows(table: Any, sizes: Sizes, work: Path) -> dict[int, dict[str, Any]]:
    """Rows 11.3-11.5: one W-process run per W of `Sizes.worlds` (W = 3 skipped where absent)."""
    cores = os.cpu_count() or 1
    summaries: dict[int, dict[str, Any]] = {}
    for row, world in (("11.3", 2), ("11.4", 3)):
        if world not in sizes.worlds:
            table.skip([row], f"{_label(sizes)}: shared summary, W={world} gloo processes", "--smoke runs W=2 only")
            continue
        s = share_summary(shared_summary(sizes, world, work))
        summaries[world] = s
        loaded = _cores_text(s, world, cores)
        table.add(
            row,
            f"{_label(sizes)}: shared summary, W={world} gloo processes: rank-0 one-process / shared wall",
            s["speedup"],
            "x",
            f"{s['n_points']} x {s['dim']}^2, G=10, probes on, {sizes.images} img; median of {s['repeats']} "
            f"interleaved pairs; one process: summary+records {s['alone_wall_s']:.2f} s wall / "
            f"{s['alone_cpu_s']:.2f} s CPU (summarize_accumulators {s['alone_own_s']:.2f} s / "
            f"{s['alone_own_cpu_s']:.2f} s CPU, records {s['alone_records_s']:.3f} s); shared, rank 0 "
            f"{s['shared_wall_s']:.2f} s: {_ranks_text(s)}; rank 0 then decodes {s['decode_s']:.3f} s, relates "
            f"histories {s['relate_s']:.3f} s, records {s['records_s']:.3f} s; {loaded}",
            text=f"{s['speedup']:.3f}x (CPU share {s['max_own_cpu_share']:.2f})",
            share=s,
        )
    if not summaries:
        table.skip(["11.5"], "shared summary: the gather", "no W-process run")
        return summaries
    worlds = sorted(summaries)
    gathers = " / ".join(f"{summaries[w]['per_rank'][0]['gather_s']:.3f}" for w in worlds)
    parts = "; ".join(
        f"W={w}: payloads {_payloads_text(summaries[w])}, rank 0 keeps its own; "
        f"{summaries[w]['gathered_payload_bytes'] / MB:.2f} MB gathered, "
        f"{summaries[w]['gather_wire_bytes'] / MB:.2f} MB on the wire padded to the largest"
        for w in worlds
    )
    table.add(
        "11.5",
        f"{_label(sizes)}: shared summary's gather at rank 0, W={' / '.join(map(str, worlds))}",
        summaries[worlds[0]]["per_rank"][0]["gather_s"],
        "s",
        f"process_group_gather over gloo on one machine (sizes all_gather + padded gather), timed after a barrier "
        f"(the wait for the slowest share is in 11.3-11.4); {parts}",
        text=f"{gathers} s",
        gathers={w: {"seconds": summaries[w]["per_rank"][0]["gather_s"]} for w in worlds},
    )
    return summaries


# ---------------------------------------------------------------------------------------------------- rows 11.6-11.8
def projection_rows(
    table: Any, sizes: Sizes, fits: dict[str, Any], summaries: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """Rows 11.6-11.8: pass seconds per image, summary seconds per rank for W = 1, 2, 3, reduce bytes."""
    fit = fits["11.1"]
    warm = _warm(fit["observations"])
    pass_s = _median([o["pass_s"] for o in warm])
    stream = _median(fit["stream_s"][-len(warm) :])
    reduce = _median(fit["reduce_s"][-len(warm) :])
    per_image = pass_s / sizes.images
    table.add(
        "11.6",
        f"{_label(sizes)}: projection input, pass seconds per image (1 process)",
        per_image,
        "s",
        f"from 11.1's fit: pass {pass_s:.2f} s over {sizes.images} img, batch {sizes.batch}, G=10, probes on = "
        f"stream {stream / sizes.images * 1e3:.1f} ms/img + reduce {reduce:.3f} s per observation (identity sum "
        f"on 1 process, {torch.get_num_threads()} torch threads; the W-process runs' sharded passes, stream + "
        f"gloo all-reduce: {_pass_text(summaries)})",
        text=f"{per_image * 1e3:.1f} ms/img",
        per_image_s=per_image,
        stream_s=stream,
        reduce_s=reduce,
    )
    out: dict[str, Any] = {"pass_per_image_s": per_image, "stream_s": stream, "reduce_s": reduce}
    if not summaries:
        table.skip(["11.7", "11.8"], "projection inputs from the W-process runs", "no W-process run")
        return out
    first = summaries[min(summaries)]
    worlds = sorted(summaries)
    estimates = {1: first["alone_own_s"], **{w: summaries[w]["estimated_rank_s"] for w in worlds}}
    alone = " / ".join(f"{summaries[w]['alone_own_s']:.2f}" for w in worlds)
    measured = " / ".join(f"{max(p['own_s'] for p in summaries[w]['per_rank']):.2f}" for w in worlds)
    shares = " / ".join(f"{summaries[w]['max_own_cpu_share']:.2f}" for w in worlds)
    merge = " / ".join(
        f"{summaries[w]['decode_s'] + summaries[w]['relate_s'] + summaries[w]['records_s']:.3f}" for w in worlds
    )
    table.add(
        "11.7",
        f"{_label(sizes)}: projection input, summary seconds per rank, W={'/'.join(map(str, estimates))}",
        estimates[max(estimates)],
        "s",
        f"summarize_accumulators of the dearest rank's share, estimated uncontended = the one-process summary "
        f"timed in the same W-process run ({alone} s; W=1 is the first) x the dearest rank's CPU share ({shares}) "
        f"at W={'/'.join(map(str, worlds))}; measured here, oversubscribed: {measured} s; plus rank 0's decode + "
        f"relate + records ({merge} s) and the gather (11.5)",
        text=" / ".join(f"{estimates[w]:.2f}" for w in estimates) + " s",
        estimates=estimates,
    )
    collectives = first["collective_bytes"]
    summable = sum(first["summable_bytes"].values())
    total = sum(collectives)
    families = ", ".join(f"{name} {b / MB:.2f} MB" for name, b in first["summable_bytes"].items())
    covariance = total - summable
    table.add(
        "11.8",
        f"{_label(sizes)}: projection input, reduce bytes per observation (both all-reduces)",
        total / MB,
        "MB",
        f"{len(collectives)} collectives of {', '.join(f'{b / MB:.2f}' for b in collectives)} MB: covariance "
        f"state + shift agreement {covariance / MB:.2f} MB (fixed: {first['n_points']} points x G x (2+D+D^2) x 8 "
        f"B), families' summables {summable / MB:.2f} MB at {sizes.images} img ({families}; "
        f"{summable / sizes.images / 1024:.1f} KB/img, they grow with the images); gathered payload in 11.5",
        collective_bytes=collectives,
        summable_bytes=first["summable_bytes"],
    )
    out.update(summary_per_rank_s=estimates, reduce_bytes=total, summable_bytes=summable)
    return out


def _pass_text(summaries: dict[int, dict[str, Any]]) -> str:
    if not summaries:
        return "none"
    return ", ".join(
        f"W={w} {max(s['pass_s']):.2f} s for {max(s['rank_images'])} img/rank, 1 torch thread each "
        f"= {max(t / n for t, n in zip(s['pass_s'], s['rank_images'], strict=True)) * 1e3:.0f} ms/img/rank"
        for w, s in sorted(summaries.items())
    )


# ---------------------------------------------------------------------------------------------------- the rows
def scale_rows(table: Any, mode: str, work: Path | None = None) -> dict[str, Any]:
    """Rows 11.1-11.8 of ``mode`` (`SIZES`) into ``table`` (`benchmarks._table.Table`), scratch files under ``work``
    (``None``: a temporary folder)."""
    sizes = SIZES[mode]
    scratch = Path(tempfile.mkdtemp(prefix="tgo_scale_", dir=work))
    fits = blocking_rows(table, sizes, scratch)
    summaries = share_rows(table, sizes, scratch)
    projection = projection_rows(table, sizes, fits, summaries)
    return {
        "sizes": dataclasses.asdict(sizes),
        "fits": fits,
        "shared": {str(w): s for w, s in summaries.items()},
        "projection": projection,
    }


if __name__ == "__main__":
    raise SystemExit(run_alone(None, "scale_bench", scale_rows, "vit_small on 32 images, 2 epochs, 2 repeats"))
