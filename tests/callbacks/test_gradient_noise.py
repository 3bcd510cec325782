"""The gradient-noise collector in real fits: its norms against brute-force per-example gradients, its records.

* One process, ``accumulate_grad_batches=2``: each step's micro-batch and accumulated squared norms (network and per
  block) equal a float64 recomputation from ``torch.func`` per-example gradients at the step's weights, and a tiny fit
  records a finite ``gradient_noise_scale`` (with a standard error) in ``geometry/metrics.csv``.
* One process without accumulation: nothing recorded; one line at fit start says what would measure it.
* DDP, 2 gloo processes on CPU: the communication hook's per-rank and all-reduced squared norms equal the brute force,
  and the trained weights are bitwise those of the same fit without the hook.
"""

from __future__ import annotations

import copy
import logging
import math

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.gradient_noise import block_columns
from callbacks.spectral_geometry import SpectralGeometryCallback
from tests.callbacks.noise_ddp_worker import BATCH, BlockNet, ddp_fit, vector_data
from tests.callbacks.noise_ddp_worker import train_data as _data
from tests.helpers import quiet_cpu_trainer
from tests.processes import fork_ranks, free_port, tiny_vit
from tgo.observatory.families.noise_scale import NOISE_SCALE
from tgo.optimisation.noise_scale import noise_scale_estimate
from tgo.records import read_metric_rows

QUIET = {"probes": {"enabled": False}, "attention": {"enabled": False}, "figures": {"heatmaps": False}}


class Classifier(L.LightningModule):
    """A user's own module around the tiny ViT: plain cross-entropy, SGD (the step is what the brute force needs)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_vit().train()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def per_example_grads(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """float64 ``{name: [N, *shape]}`` per-example gradients of the cross-entropy (torch.func vmap(grad))."""
    from torch.func import functional_call, grad, vmap

    net = copy.deepcopy(net).double().eval()
    params = {k: v.detach() for k, v in net.named_parameters()}

    def loss(p, xi, yi):
        return torch.nn.functional.cross_entropy(functional_call(net, p, (xi[None],)), yi[None])

    return vmap(grad(loss), in_dims=(None, 0, 0))(params, x.double(), y)


def column_sq(net: torch.nn.Module, grads: dict[str, torch.Tensor]) -> np.ndarray:
    """Squared norms of one gradient ``{name: tensor}`` in the collector's columns (network, blocks)."""
    column_of, columns = block_columns(net)
    out = np.zeros(columns)
    for name, p in net.named_parameters():
        sq = float((grads[name].double() ** 2).sum())
        out[0] += sq
        if id(p) in column_of:
            out[column_of[id(p)]] += sq
    return out


def brute_steps(net0: torch.nn.Module, data: TensorDataset, micro: int, micro_per_step: int, lr: float = 0.1):
    """Replays SGD on the micro-batches with per-example gradients: each step's mean micro |g|^2 and |mean g|^2."""
    net = copy.deepcopy(net0)
    x_all, y_all = data.tensors
    rows = []
    for start in range(0, len(data), micro * micro_per_step):
        per = per_example_grads(
            net, x_all[start : start + micro * micro_per_step], y_all[start : start + micro * micro_per_step]
        )
        micro_means = [
            {k: v[i * micro : (i + 1) * micro].mean(0) for k, v in per.items()} for i in range(micro_per_step)
        ]
        big = {k: torch.stack([m[k] for m in micro_means]).mean(0) for k in per}
        small = np.mean([column_sq(net, m) for m in micro_means], axis=0)
        rows.append((small, column_sq(net, big)))
        with torch.no_grad():
            for name, p in net.named_parameters():
                p -= lr * big[name].to(p.dtype)
    return rows


def _trainer(root, geometry: SpectralGeometryCallback, **options) -> L.Trainer:
    """One quiet CPU epoch with the geometry callback (``options``: accumulation, batch limits)."""
    return quiet_cpu_trainer(root, [geometry], **options)


def test_accumulation_norms_equal_brute_force_and_a_fit_records_the_noise_scale(tmp_path, caplog):
    module = Classifier()
    start = copy.deepcopy(module.net)
    geometry = SpectralGeometryCallback(analysis=_data(6, seed=9), every_n_epochs=1, groups=0, **QUIET)
    taken = []
    original = SpectralGeometryCallback._training_info

    def spy(self, trainer, pl_module, epoch):  # what the family will take: copy the steps before it resets them
        collector = self.collectors["noise_scale"]
        taken.append((list(collector._rows), list(collector._inv)))
        return original(self, trainer, pl_module, epoch)

    trainer = _trainer(tmp_path, geometry, accumulate_grad_batches=2)
    SpectralGeometryCallback._training_info = spy  # type: ignore[method-assign]
    try:
        trainer.fit(module, DataLoader(_data(), batch_size=BATCH, shuffle=False))
    finally:
        SpectralGeometryCallback._training_info = original  # type: ignore[method-assign]
    rows, inv = taken[-1]
    table = torch.stack([r for r in rows]).numpy()
    k = table.shape[1] // 2
    want = brute_steps(start, _data(), BATCH, 2)
    assert len(want) == table.shape[0] == 2
    for (small, big), got in zip(want, table, strict=True):
        np.testing.assert_allclose(got[:k], small, rtol=1e-5)
        np.testing.assert_allclose(got[k:], big, rtol=1e-5)
    assert inv == [(1 / BATCH, 1 / (2 * BATCH))] * 2
    metrics = {(r["epoch"], r["point"], r["view"], r["metric"]): r for r in read_metric_rows(tmp_path)}
    noise = metrics[("1", "cls", "network", "gradient_noise_scale")]
    expected = noise_scale_estimate(  # the estimator on the brute-force steps: NaN where |G|^2 is not resolved
        np.array([w[0] for w in want]), np.array([w[1] for w in want]), *(np.array(v) for v in zip(*inv, strict=True))
    )
    np.testing.assert_allclose(float(noise["value"]), expected.noise_scale[0], rtol=1e-4, equal_nan=True)
    np.testing.assert_allclose(
        float(metrics[("1", "cls", "network", "gradient_trace_covariance")]["value"]),
        expected.trace_covariance[0],
        rtol=1e-4,
    )
    assert math.isfinite(float(metrics[("1", "cls", "network", "gradient_norm_sq")]["value"]))
    assert float(metrics[("1", "cls", "network", "gradient_noise_steps")]["value"]) == 2
    assert ("1", "block_01", "gradient", "gradient_noise_scale") in metrics
    assert float(metrics[("0", "cls", "network", "gradient_noise_steps")]["value"]) == 0  # before any step


def test_accumulation_hooks_leave_training_bitwise_unchanged_and_leave_with_the_fit(tmp_path):
    """The gradient hooks read what the backward hands each parameter and return nothing: the trained weights are
    bitwise those of the same fit without the noise scale, and no hook stays on a parameter after ``fit``."""
    trained = {}
    for enabled in (True, False):
        torch.manual_seed(3)
        module = Classifier()
        geometry = SpectralGeometryCallback(
            analysis=_data(6, seed=9), every_n_epochs=1, groups=0, **QUIET, noise_scale={"enabled": enabled}
        )
        _trainer(tmp_path / str(enabled), geometry, accumulate_grad_batches=2).fit(
            module, DataLoader(_data(), batch_size=BATCH, shuffle=False)
        )
        assert all(not p._backward_hooks for p in module.parameters())  # type: ignore[attr-defined]
        trained[enabled] = {k: v.clone() for k, v in module.state_dict().items()}
    for name, value in trained[True].items():
        assert torch.equal(value, trained[False][name]), name


def test_one_device_without_accumulation_says_once_what_would_measure_it_and_records_nothing(tmp_path, caplog):
    geometry = SpectralGeometryCallback(analysis=_data(6, seed=9), every_n_epochs=1, groups=0, **QUIET)
    trainer = _trainer(tmp_path, geometry, limit_train_batches=2)
    with caplog.at_level(logging.INFO):
        trainer.fit(Classifier(), DataLoader(_data(), batch_size=BATCH))
    lines = [r.getMessage() for r in caplog.records]
    said = [i for i, line in enumerate(lines) if "gradient noise scale" in line]
    first_observation = next(i for i, line in enumerate(lines) if "streamed and reduced" in line)
    assert len(said) == 1 and said[0] < first_observation, "one line, at fit start"
    assert "DDP on >= 2 ranks" in lines[said[0]] and "accumulate_grad_batches >= 2" in lines[said[0]]
    rows = read_metric_rows(tmp_path)
    assert {r["epoch"] for r in rows} == {"0", "1"}  # both observations recorded the rest
    assert not {r["metric"] for r in rows} & {m.name for m in NOISE_SCALE.observables}


# ---------------------------------------------------------------------------------------------------------- DDP
def test_ddp_hook_norms_equal_brute_force_and_leave_training_bitwise_unchanged(tmp_path):
    """2 gloo ranks, 2 SGD steps: per-rank and all-reduced squared norms (network and blocks) against float64
    per-example gradients; the steps summed over ranks are the mean local and the global norm with ``a = 1/b``,
    ``c = 1/(W b)``; and the weights after training equal those of the same fit without the hook, bit for bit."""
    world = 2
    fork_ranks(ddp_fit, (world, free_port(), str(tmp_path)), world)
    saved = [torch.load(tmp_path / f"1_{rank}.pt", weights_only=True) for rank in range(world)]
    net = BlockNet()
    x_all, y_all = vector_data().tensors
    for step in range(2):
        batch = slice(step * world * BATCH, (step + 1) * world * BATCH)
        per = per_example_grads(net, x_all[batch], y_all[batch])
        local = [{k: v[r * BATCH : (r + 1) * BATCH].mean(0) for k, v in per.items()} for r in range(world)]
        mean = {k: v.mean(0) for k, v in per.items()}
        for rank in range(world):
            got_local, got_reduced = saved[rank]["norms"][step]
            np.testing.assert_allclose(got_local.numpy(), column_sq(net, local[rank]), rtol=1e-5)
            np.testing.assert_allclose(got_reduced.numpy(), column_sq(net, mean), rtol=1e-5)
        small = sum(s["small"][step] for s in saved).numpy()
        big = sum(s["big"][step] for s in saved).numpy()
        np.testing.assert_allclose(small, np.mean([column_sq(net, g) for g in local], axis=0), rtol=1e-5)
        np.testing.assert_allclose(big, column_sq(net, mean), rtol=1e-5)
        np.testing.assert_allclose(sum(s["inv"][step] for s in saved).numpy(), [1 / BATCH, 1 / (world * BATCH)])
        with torch.no_grad():
            for name, p in net.named_parameters():
                p -= 0.1 * mean[name].to(p.dtype)
    for rank in range(world):
        off = torch.load(tmp_path / f"0_{rank}.pt", weights_only=True)["weights"]
        for key, value in off.items():
            assert torch.equal(value, saved[rank]["weights"][key]), key


def test_a_step_of_one_micro_batch_is_counted_as_excluded_with_its_reason_once(tmp_path, caplog):
    """5 micro-batches at ``accumulate_grad_batches=2``: steps of 2, 2 and 1. The last has one batch size only (its
    small and big batch are one gradient): it is recorded as excluded (``gradient_noise_excluded`` 1, not dropped
    unseen), the log says why once, and the estimate is that of the two full steps (brute force)."""
    module = Classifier()
    start = copy.deepcopy(module.net)
    data = _data(10)
    geometry = SpectralGeometryCallback(analysis=_data(6, seed=9), every_n_epochs=1, groups=0, **QUIET)
    with caplog.at_level(logging.INFO):
        _trainer(tmp_path, geometry, accumulate_grad_batches=2).fit(
            module, DataLoader(data, batch_size=BATCH, shuffle=False)
        )
    said = [r.getMessage() for r in caplog.records if "one micro-batch" in r.getMessage()]
    assert len(said) == 1 and "gradient_noise_excluded" in said[0] and "\n" not in said[0]
    metrics = {(r["epoch"], r["metric"]): r for r in read_metric_rows(tmp_path) if r["view"] == "network"}
    assert float(metrics[("1", "gradient_noise_steps")]["value"]) == 2
    assert float(metrics[("1", "gradient_noise_excluded")]["value"]) == 1
    full = TensorDataset(*(t[: 4 * BATCH] for t in data.tensors))  # the two steps of two micro-batches
    want = brute_steps(start, full, BATCH, 2)
    inv = np.array([[1 / BATCH, 1 / (2 * BATCH)]] * 2)
    expected = noise_scale_estimate(
        np.array([w[0] for w in want]), np.array([w[1] for w in want]), inv[:, 0], inv[:, 1]
    )
    np.testing.assert_allclose(
        float(metrics[("1", "gradient_trace_covariance")]["value"]), expected.trace_covariance[0], rtol=1e-4
    )
    np.testing.assert_allclose(
        float(metrics[("1", "gradient_noise_scale")]["value"]), expected.noise_scale[0], rtol=1e-4, equal_nan=True
    )
