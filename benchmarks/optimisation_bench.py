"""Rows 12: the training-time cost of the optimisation observables (issue 25; target: <= 2% per epoch).

12.1 seconds per quickstart training epoch without TGO; 12.2 the gradient-noise collector's ratio to it; 12.3 one
observation with the weights family on / off (docs/benchmarks.md, rows 12). Interleaved repeats (``B V B V ...``,
`benchmarks._harness.interleaved`). ``python -m benchmarks.optimisation_bench [--quick | --smoke] [--repeats N]``.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from benchmarks import _harness as h
from benchmarks._table import run_alone


class _Collect(L.Callback):
    """The collector alone, its hooks forwarded as `SpectralGeometryCallback` forwards them."""

    def __init__(self) -> None:
        from callbacks.gradient_noise import GradientNoiseCollector
        from tgo.observatory.families.noise_scale import NoiseScaleSettings

        self.collector = GradientNoiseCollector(NoiseScaleSettings())

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.collector.attach(trainer, pl_module, pl_module.net)  # type: ignore[arg-type]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *a: Any) -> None:
        self.collector.on_train_batch_start(batch)

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.collector.on_after_backward()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        self.collector.on_before_optimizer_step(trainer)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.collector.detach()


def _epoch(smoke: bool, callbacks: list[L.Callback], root: Path) -> None:
    arch = {"depth": 2, "embed_dim": 32, "num_heads": 2} if smoke else None
    net = h.build_model("quickstart", image_size=24, arch=arch)
    data = h.random_images(32 if smoke else 1024, 24, seed=1, classes=10)
    trainer = L.Trainer(
        max_epochs=1,
        accumulate_grad_batches=2,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        accelerator="auto",
        devices=1,
    )
    module = h.classifier(net, lambda parameters: torch.optim.AdamW(parameters, lr=1e-3))
    trainer.fit(module, DataLoader(data, batch_size=8 if smoke else 32, shuffle=False))


def _geometry(weights: bool, smoke: bool) -> L.Callback:
    from callbacks.spectral_geometry import SpectralGeometryCallback

    analysis = h.random_images(20 if smoke else 100, 24, seed=2, classes=10)
    figures = h.figures_off() if smoke else {"heatmaps": False}  # smoke: the API, not the drawing
    return SpectralGeometryCallback(
        analysis=analysis, every_n_epochs=1, groups=0, weights={"enabled": weights}, figures=figures
    )


def _rounded(values: Any) -> list[float]:
    return [round(float(v), 4) for v in values]


def optimisation_rows(table: Any, profile_name: str, repeats: int | None = None) -> list[dict[str, Any]]:
    """Rows 12 into ``table`` (`benchmarks._table.Table`): ``repeats`` interleaved repeats (``None``: 5 by default,
    3 with ``quick``, 1 at toy sizes with ``smoke``); returns ``{"row", "value", "unit", "detail"}`` per row."""
    smoke = profile_name == "smoke"
    repeats = repeats or {"default": 5, "quick": 3}.get(profile_name, 1)
    tmp = Path(tempfile.mkdtemp(prefix="tgo_optimisation_bench_"))
    counter = iter(range(10**6))

    def epoch(*callbacks: Any) -> Any:
        return lambda: _epoch(smoke, [c() for c in callbacks], tmp / f"run_{next(counter)}")

    noise = h.interleaved(epoch(), {"noise": epoch(_Collect)}, repeats)
    weights = functools.partial(_geometry, smoke=smoke)
    timed = h.interleaved(epoch(lambda: weights(False)), {"weights": epoch(lambda: weights(True))}, repeats)
    rows = [
        {"row": "12.1", "value": noise["baseline"]["median_s"], "unit": "s/epoch", "detail": "no TGO callback"},
        {
            "row": "12.2",
            "value": noise["noise"]["ratio"],
            "unit": "x",
            "detail": f"collector / baseline; repeats {_rounded(noise['noise']['ratios'])}",
        },
        {
            "row": "12.3",
            "value": timed["weights"]["ratio"],
            "unit": "x",
            "detail": f"epoch + observation, weights on / off; repeats {_rounded(timed['weights']['ratios'])}",
        },
    ]
    for row in rows:
        table.add(row["row"], _MEASUREMENTS[row["row"]], row["value"], row["unit"], row["detail"])
    return rows


_MEASUREMENTS = {
    "12.1": "quickstart training epoch (accumulation 2), no TGO callback",
    "12.2": "quickstart epoch with the gradient-noise collector / without",
    "12.3": "quickstart epoch + one observation, weights family on / off",
}


if __name__ == "__main__":
    raise SystemExit(
        run_alone(
            None,
            "optimisation_bench",
            lambda t, mode, work, repeats: optimisation_rows(t, mode, repeats),
            "3 interleaved repeats",
            repeats=True,
        )
    )
