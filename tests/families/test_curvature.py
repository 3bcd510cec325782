"""The curvature family: the seam's rules (`check_family`), the records' layout, the optimizers' references, when it
measures, and 1 vs 2 gloo processes bit for bit."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from tests.helpers import quiet_cpu_trainer
from tests.processes import fork_ranks, free_port, tiny_vit
from tgo.observatory.families import CURVATURE, NETWORK_VIEW, TrainingInfo
from tgo.observatory.families.curvature import CURVATURE_METRICS, curvature_due, deal_tasks
from tgo.observatory.families.testing import check_family
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
from tgo.observatory.points import vit_points
from tgo.observatory.settings import ObservationSettings
from tgo.optimisation.curvature import (
    LOSS_ARRAY,
    HessianOperator,
    adam_preconditioner,
    curvature_batch_indices,
    lanczos,
    load_batch,
    read_loss_label,
)
from tgo.records import RecordWriter

IMAGES = 10  # analysis images (uneven shards on 3 simulated ranks); the curvature batch takes 4 of them
CURVATURE_SETTINGS = {
    "enabled": True,
    "images": 4,
    "batch_size": 4,
    "top_k": 2,
    "trace_probes": 3,
    "lanczos_iterations": 5,
    "dtype": "float64",
}
ARRAYS = {
    "hessian_top_eigenvalues": (2,),
    "hessian_top_residuals": (2,),
    "hessian_trace_samples": (3,),
    "preconditioned_residual": (1,),
    "curvature_lanczos_steps": (2,),
}


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(2)
    return TensorDataset(torch.randn(IMAGES, 3, 16, 16, generator=g), torch.arange(IMAGES) % 3)


def settings(**curvature: Any) -> ObservationSettings:
    """3 jackknife groups, the curvature family on; the other families off (each has its own tests)."""
    values: dict[str, Any] = {"groups": 3, "probes": {"enabled": False}, "attention": {"enabled": False}}
    for other in ("weights", "phases", "noise_scale"):
        if hasattr(ObservationSettings(), other):
            values[other] = {"enabled": False}
    return ObservationSettings.from_config({**values, "curvature": {**CURVATURE_SETTINGS, **curvature}})


def trained(optimizer: str, lr: float) -> tuple[torch.nn.Module, Any]:
    """The tiny ViT after two full-batch steps of ``optimizer`` on the analysis images (the same in every process)."""
    net = tiny_vit().train()
    images, labels = dataset().tensors
    opt: Any = (
        torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.05)
        if optimizer == "adamw"
        else torch.optim.SGD(net.parameters(), lr=lr)
    )
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(images), labels).backward()
        opt.step()
    return net.eval(), opt


def observe(net: torch.nn.Module, run_dir: Path, training: TrainingInfo | None = None, **kw: Any) -> Any:
    rank, world, reduce = kw.pop("rank", 0), kw.pop("world_size", 1), kw.pop("all_reduce_sum", lambda t: t)
    return observe_and_record(
        net,
        dataset(),
        vit_points(net),
        settings=settings(**kw),
        plan=ShardPlan(rank, world, 2),
        record=RecordPlan(RecordWriter(run_dir), epoch=training.epoch if training else 0, step=0),
        all_reduce_sum=reduce,
        is_global_zero=rank == 0,
        training=training,
    )


def network(results: Any, net: torch.nn.Module) -> Any:
    return results[(vit_points(net)[-1].name, NETWORK_VIEW)]


def direct(net: torch.nn.Module, optimizer: Any = None, lr: float = math.nan) -> dict[str, Any]:
    """What the family must record, computed here from the numerics module on the same batch and seeds."""
    s = settings().curvature
    data = dataset()
    images, labels = load_batch(data, curvature_batch_indices(data.tensors[1].numpy(), s.images, s.seed))
    op = HessianOperator(net, images, labels, batch_size=s.batch_size)
    top = lanczos(op.matvec, op.dim, k=s.top_k, iterations=s.lanczos_iterations, tol=s.lanczos_tol, seed=s.seed)
    out: dict[str, Any] = {"top": top}
    pre = adam_preconditioner(optimizer, [p for p in net.parameters() if p.requires_grad], lr)
    if pre.diagonal is not None:
        d = 1.0 / np.sqrt(pre.diagonal)
        out["pre"] = lanczos(
            lambda v: d * op.matvec(d * v),
            op.dim,
            k=1,
            iterations=s.lanczos_iterations,
            tol=s.lanczos_tol,
            seed=s.seed + 1,
        )
    out["threshold"] = pre.threshold
    return out


def test_check_family_and_the_record_layout_offline(tmp_path: Path):
    net = tiny_vit()
    check = check_family(CURVATURE, net, dataset(), tmp_path, settings=settings())
    assert all(len(c) == 2 for c in check.calls)  # no collective of its own
    point = vit_points(net)[-1].name
    assert sorted(check.metrics) == sorted((point, NETWORK_VIEW, m) for m in CURVATURE_METRICS)
    result = network(check.single[0], net)
    assert {a: result.arrays[a].shape for a in ARRAYS} == ARRAYS
    want = direct(net)
    np.testing.assert_array_equal(result.arrays["hessian_top_eigenvalues"], want["top"].eigenvalues)
    np.testing.assert_array_equal(result.arrays["hessian_top_residuals"], want["top"].residuals)
    assert result.observables["hessian_top_eigenvalue"] == want["top"].eigenvalues[0]
    samples = result.arrays["hessian_trace_samples"]
    assert result.observables["hessian_trace"] == np.mean(samples)
    assert result.stderr["hessian_trace"] == pytest.approx(np.std(samples, ddof=1) / np.sqrt(3), rel=1e-12)
    assert result.arrays["curvature_lanczos_steps"].tolist() == [want["top"].steps, 0]
    for name in ("preconditioned_sharpness", "edge_of_stability_threshold", "sharpness_over_threshold"):
        assert math.isnan(result.observables[name]), name  # offline: no optimizer
    assert np.isnan(result.arrays["preconditioned_residual"]).all()
    assert read_loss_label(result.arrays[LOSS_ARRAY]) == "cross_entropy (offline: no training module)"
    # the 3 simulated ranks dealt the work (rank 0 Lanczos, ranks 1-2 the probes) and still gave the same bits
    ranks = network(check.ranks, net)
    assert all(np.array_equal(ranks.arrays[a], result.arrays[a], equal_nan=True) for a in ARRAYS)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_the_optimizers_reference_from_training(tmp_path: Path, optimizer: str):
    lr = 0.003
    net, opt = trained(optimizer, lr)
    grads = [None if p.grad is None else p.grad.clone() for p in net.parameters()]
    info = TrainingInfo(epoch=0, global_step=2, optimizer=opt, learning_rate=lr, loss=None)
    result = network(observe(net, tmp_path, info), net)
    assert all(  # the observation left every .grad as it was
        (g is None and p.grad is None) or (g is not None and p.grad is not None and torch.equal(p.grad, g))
        for p, g in zip(net.parameters(), grads, strict=True)
    )
    want = direct(net, opt, lr)
    got = result.observables
    if optimizer == "adamw":
        assert got["edge_of_stability_threshold"] == pytest.approx(38.0 / lr, rel=1e-14)
        assert got["preconditioned_sharpness"] == want["pre"].eigenvalues[0]
        assert result.arrays["preconditioned_residual"][0] == want["pre"].residuals[0]
        assert result.arrays["curvature_lanczos_steps"][1] == want["pre"].steps > 0
    else:
        assert got["edge_of_stability_threshold"] == pytest.approx(2.0 / lr, rel=1e-14)
        assert got["preconditioned_sharpness"] == got["hessian_top_eigenvalue"] == want["top"].eigenvalues[0]
    ratio = got["preconditioned_sharpness"] / got["edge_of_stability_threshold"]
    assert got["sharpness_over_threshold"] == ratio and math.isfinite(ratio)


def test_every_n_observations_and_the_dealing():
    s = ObservationSettings.from_config({"every_n_epochs": 5, "curvature": {"every_n_observations": 2}})
    assert [e for e in (0, 5, 10, 12, 15, 20) if curvature_due(s, e)] == [0, 10, 20]  # 12 (final) counts as 3rd
    assert curvature_due(s, None)  # offline: every observation
    one = deal_tasks(1, 30, 16, True)
    assert len(one) == 1 and len(one[0]) == 18
    three = deal_tasks(3, 30, 16, True)
    kinds = [(t.kind, t.index) for rank in three for t in rank]
    assert sorted(kinds) == sorted((t.kind, t.index) for t in one[0])  # every task exactly once
    assert [t.kind for t in three[0]] == ["lanczos"] and three[1][0].kind == "preconditioned"
    assert [len(r) for r in three] == [1, 1, 16]  # a Lanczos run weighs 30 products, a probe 1


def test_a_training_observation_that_is_not_due_records_no_curvature(tmp_path: Path):
    net = tiny_vit()
    info = TrainingInfo(epoch=5, global_step=10)
    results = observe(net, tmp_path, info, every_n_observations=2)
    assert (vit_points(net)[-1].name, NETWORK_VIEW) not in results


def _ddp_worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    net, opt = trained("adamw", 0.003)
    info = TrainingInfo(epoch=0, global_step=2, optimizer=opt, learning_rate=0.003)
    results = observe(
        net, Path(out).parent / "ddp", info, rank=rank, world_size=world_size, all_reduce_sum=all_reduce_sum
    )
    if rank == 0:
        r = network(results, net)
        torch.save({"observables": dict(r.observables), "stderr": dict(r.stderr), "arrays": dict(r.arrays)}, out)
    dist.barrier()  # no rank tears gloo down while another still uses it (an abort under load)
    dist.destroy_process_group()


def test_two_gloo_processes_record_what_one_process_records(tmp_path: Path):
    out = tmp_path / "rank0.pt"
    fork_ranks(_ddp_worker, (2, free_port(), str(out)), 2)
    two = torch.load(out, weights_only=False)  # its own workers wrote it (numpy arrays inside)
    net, opt = trained("adamw", 0.003)
    one = network(
        observe(net, tmp_path / "one", TrainingInfo(epoch=0, global_step=2, optimizer=opt, learning_rate=0.003)), net
    )
    assert list(two["observables"]) == list(one.observables)
    for name in CURVATURE_METRICS:
        assert np.array_equal(two["observables"][name], one.observables[name], equal_nan=True), name
        assert np.array_equal(two["stderr"][name], one.stderr[name], equal_nan=True), name
    for name in ARRAYS:
        np.testing.assert_array_equal(two["arrays"][name], one.arrays[name], err_msg=name)
    assert math.isfinite(one.observables["preconditioned_sharpness"])  # rank 1 ran it under 2 processes


# ----------------------------------------------------------------------------------------------------- the loss
SMOOTHING = 0.1


def smoothed_module() -> Any:
    """TGO's own module around a 1-block ViT of width 4 at 8 px (415 parameters), label smoothing 0.1, float64."""
    from tgo.model import ViTClassifier

    torch.manual_seed(0)
    arch = {"patch_size": 4, "embed_dim": 4, "depth": 1, "num_heads": 2, "mlp_ratio": 2}
    module = ViTClassifier("vit_tiny_patch16_224", num_classes=3, img_size=8, arch=arch, label_smoothing=SMOOTHING)
    module.net.double().eval()
    return module


def small_images() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    return TensorDataset(torch.randn(6, 3, 8, 8, generator=g, dtype=torch.float64), torch.arange(6) % 3)


def dense_hessian(net: torch.nn.Module, loss: Any, images: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """The full Hessian of ``loss(net(images), labels)``, row by row by ``torch.autograd`` double backward (eval mode,
    attention unfused): independent of `HessianOperator`'s chunking, flattening and float64 summation, and not
    ``torch.func``, whose LayerNorm double backward is wrong in the torch this project pins."""
    from tgo.optimisation.curvature import unfused_eval

    params = [p for p in net.parameters() if p.requires_grad]
    with unfused_eval(net):
        grads = torch.autograd.grad(loss(net(images), labels), params, create_graph=True)
        flat = torch.cat([g.reshape(-1) for g in grads])
        rows = []
        for i in range(flat.numel()):
            row = torch.autograd.grad(flat[i], params, retain_graph=True, allow_unused=True)
            rows.append(
                torch.cat(
                    [
                        (r if r is not None else torch.zeros_like(p)).reshape(-1)
                        for r, p in zip(row, params, strict=True)
                    ]
                )
            )
    return torch.stack(rows).detach().numpy()


def test_tgos_module_declares_its_label_smoothed_objective_and_the_record_measures_and_names_it(tmp_path: Path):
    """The curvature of TGO's own module is that of the objective the optimizer follows: the recorded top
    eigenvalues and every Hutchinson sample equal those of a dense Hessian of the label-smoothed cross-entropy to
    1e-9, and are not those of plain cross-entropy (which the family measured before the loss protocol)."""
    from tgo.optimisation.curvature import rademacher_probe, training_loss

    module = smoothed_module()
    net, data = module.net, small_images()
    loss = training_loss(module)
    assert loss.declared and loss.name == "ViTClassifier.tgo_loss: cross_entropy(label_smoothing=0.1)"
    curvature = {"images": 6, "batch_size": 4, "top_k": 3, "trace_probes": 4, "lanczos_iterations": 200}
    config = {**curvature, "lanczos_tol": 1e-12, "dtype": "float64", "enabled": True}
    observed = settings(**config)
    results = observe_and_record(
        net,
        data,
        vit_points(net),
        settings=observed,
        plan=ShardPlan(0, 1, 3),
        record=RecordPlan(RecordWriter(tmp_path), epoch=0, step=0),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
        training=TrainingInfo(epoch=0, global_step=0, loss=loss),
    )
    result = network(results, net)
    s = observed.curvature
    images, labels = load_batch(data, curvature_batch_indices(data.tensors[1].numpy(), s.images, s.seed))
    smoothed = dense_hessian(
        net, lambda z, y: torch.nn.functional.cross_entropy(z, y, label_smoothing=SMOOTHING), images, labels
    )
    exact = np.linalg.eigvalsh(smoothed)[::-1][:3]
    top = result.arrays["hessian_top_eigenvalues"]
    np.testing.assert_allclose(top, exact, rtol=0, atol=1e-9 * abs(exact[0]))
    probes = [rademacher_probe(smoothed.shape[0], s.seed, i) for i in range(4)]
    samples = np.array([z @ smoothed @ z for z in probes])
    np.testing.assert_allclose(
        result.arrays["hessian_trace_samples"], samples, rtol=0, atol=1e-9 * np.abs(samples).max()
    )
    plain = np.linalg.eigvalsh(dense_hessian(net, torch.nn.functional.cross_entropy, images, labels))[-1]
    assert abs(plain / exact[0] - 1) > 0.01  # the substitute would fail the check above by far more than 1e-9
    assert read_loss_label(result.arrays[LOSS_ARRAY]) == loss.name
    from tgo.records import load_spectra

    point = vit_points(net)[-1].name
    recorded = load_spectra(tmp_path, view=NETWORK_VIEW, arrays=(LOSS_ARRAY,))[0][point][LOSS_ARRAY]
    assert read_loss_label(recorded) == loss.name  # read back from the spectra file on disk


def _fit_with_curvature(module: Any, root: Path) -> Any:
    """One SGD epoch of ``module`` with the geometry callback measuring curvature at epochs 0 and 1 (float64)."""
    from torch.utils.data import DataLoader

    from callbacks.spectral_geometry import SpectralGeometryCallback

    curvature = {"enabled": True, "images": 6, "batch_size": 6, "top_k": 1, "trace_probes": 2, "lanczos_iterations": 3}
    data = small_images()
    train = TensorDataset(data.tensors[0].float(), data.tensors[1])  # the network trains and is observed in float32
    geometry = SpectralGeometryCallback(
        analysis=train,
        every_n_epochs=1,
        groups=0,
        probes={"enabled": False},
        attention={"enabled": False},
        noise_scale={"enabled": False},
        figures={"heatmaps": False},
        curvature={**curvature, "dtype": "float64"},
    )
    quiet_cpu_trainer(root, [geometry]).fit(module, DataLoader(train, batch_size=2))
    return geometry


def _user_module(declared: bool) -> Any:
    """A user's own LightningModule (SGD, cross-entropy with smoothing 0.2), with or without the loss protocol."""
    import lightning as L

    def objective(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.2)

    class Plain(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = smoothed_module().net.float()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return objective(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Declared(Plain):
        tgo_loss_name = "cross_entropy(label_smoothing=0.2)"

        def tgo_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return objective(logits, labels)

    return Declared() if declared else Plain()


def test_a_users_module_without_tgo_loss_is_told_once_and_the_record_says_plain_cross_entropy(tmp_path: Path):
    import warnings

    from tgo.optimisation import curvature as numerics
    from tgo.records import load_spectra

    module = _user_module(declared=False)
    numerics._WARNED_UNDECLARED.discard(type(module).__name__)  # once per process: this test's class afresh
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit_with_curvature(module, tmp_path)
    said = [str(w.message) for w in caught if "tgo_loss" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0] and "plain cross-entropy" in said[0]  # two observations, one line
    point = vit_points(module.net)[-1].name
    spectra = load_spectra(tmp_path, view=NETWORK_VIEW, arrays=(numerics.LOSS_ARRAY,))
    labels = {epoch: numerics.read_loss_label(points[point][numerics.LOSS_ARRAY]) for epoch, points in spectra.items()}
    assert labels == {0: "cross_entropy (Plain defines no tgo_loss)", 1: "cross_entropy (Plain defines no tgo_loss)"}


def test_a_users_module_that_declares_tgo_loss_is_measured_on_it_through_the_callback(tmp_path: Path):
    """The documented protocol end to end: the record names the declared loss and its Hutchinson samples at the
    final weights are those of a dense Hessian of that loss (smoothing 0.2) to 1e-9; no warning."""
    import warnings

    from tgo.optimisation.curvature import rademacher_probe
    from tgo.records import load_spectra

    module = _user_module(declared=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        geometry = _fit_with_curvature(module, tmp_path)
    assert not [w for w in caught if "tgo_loss" in str(w.message)]
    point = vit_points(module.net)[-1].name
    last = load_spectra(tmp_path, [1], view=NETWORK_VIEW, arrays=(LOSS_ARRAY, "hessian_trace_samples"))[1][point]
    assert read_loss_label(last[LOSS_ARRAY]) == "cross_entropy(label_smoothing=0.2)"
    s = geometry.settings.curvature
    data = small_images()
    images, labels = load_batch(data, curvature_batch_indices(data.tensors[1].numpy(), s.images, s.seed))
    net = module.net.double()  # the final weights
    h = dense_hessian(net, module.tgo_loss, images.float().double(), labels)  # the float32 images the run observed
    samples = np.array([z @ h @ z for z in (rademacher_probe(h.shape[0], s.seed, i) for i in range(2))])
    np.testing.assert_allclose(last["hessian_trace_samples"], samples, rtol=0, atol=1e-9 * np.abs(samples).max())
