"""The block-Jacobian family: every metric equals the spectrum of a dense ``torch.autograd`` Jacobian of each block
of a tiny ViT (each block's whole ``T D x T D`` Jacobian, its diagonal ``D x D`` blocks per token, numpy's SVD),
1 process = 3 simulated ranks with the same two collectives (`check_family`), recorded, scheduled and declared."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import timm
import torch
from torch.utils.data import TensorDataset

from tgo import panels
from tgo.observatory.families import enabled_families
from tgo.observatory.families.block_jacobian import (
    BLOCK_JACOBIAN,
    BLOCK_JACOBIAN_METRICS,
    BlockJacobianSettings,
    jacobian_due,
)
from tgo.observatory.families.testing import check_family
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
from tgo.observatory.points import vit_points
from tgo.observatory.settings import ObservationSettings, ObservationSettingsError
from tgo.optimisation.block_jacobian import token_positions
from tgo.optimisation.curvature import curvature_batch_indices, load_batch
from tgo.records import RecordWriter, read_metric_rows

IMAGES, FIXED, TOKENS = 7, 2, 3  # analysis images; the family's fixed images and tokens per image
FAMILY = {"enabled": True, "images": FIXED, "tokens": TOKENS, "chunk": 5, "lanczos_iterations": 300}


def tiny_vit() -> torch.nn.Module:
    """A 2-block, width-16 timm ViT at 16 px, patch 4: 17 tokens, so each block's Jacobian is 272 x 272."""
    torch.manual_seed(0)
    net = timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3
    )
    return net.eval()


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(IMAGES, 3, 16, 16, generator=g), torch.arange(IMAGES) % 3)


def config(**family: Any) -> dict[str, Any]:
    return {
        "groups": 3,
        "probes": {"enabled": False},
        "attention": {"enabled": False},
        "block_jacobian": {**FAMILY, **family},
    }


def dense_reference(net: torch.nn.Module, data: TensorDataset) -> dict[str, dict[str, np.ndarray]]:
    """Per block point: every fixed image's whole Jacobian by ``torch.autograd.functional.jacobian`` on a float64
    copy (fused attention as it is), its top singular value and its token-diagonal blocks' singular values."""
    net = copy.deepcopy(net).double().eval()
    images, _ = load_batch(data, curvature_batch_indices(data.tensors[1].numpy(), FIXED, 0))
    inputs: list[torch.Tensor] = []
    blocks: list[Any] = list(net.blocks)  # type: ignore[arg-type]
    handles = [b.register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach())) for b in blocks]
    with torch.no_grad():
        net(images.double())
    for h in handles:
        h.remove()
    out = {}
    for point, block, x in zip((p.name for p in vit_points(net)[2:-1]), blocks, inputs, strict=True):
        t, d = x.shape[1:]
        singular, norms = [], []
        for image in x:
            jac = torch.autograd.functional.jacobian(block, image[None]).reshape(t * d, t * d).numpy()
            norms.append(np.linalg.svd(jac, compute_uv=False)[0])
            singular += [
                np.linalg.svd(jac[k * d : (k + 1) * d, k * d : (k + 1) * d], compute_uv=False)
                for k in token_positions(t, TOKENS)
            ]
        out[point] = {"singular": np.array(singular), "norm": np.array(norms)}
    return out


def observe(net: torch.nn.Module, run_dir: Path, **family: Any) -> Any:
    return observe_and_record(
        net,
        dataset(),
        vit_points(net),
        settings=ObservationSettings.from_config(config(**family)),
        plan=ShardPlan(0, 1, 4),
        record=RecordPlan(RecordWriter(run_dir), epoch=0, step=0, with_covariance=True),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )


def spread(x: np.ndarray) -> tuple[float, float]:
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))


def test_every_metric_equals_the_dense_autograd_jacobian(tmp_path):
    net = tiny_vit()
    before = [p.detach().clone() for p in net.parameters()]
    results = observe(net, tmp_path, lanczos_tol=1e-13)  # Lanczos to convergence
    assert all(torch.equal(a, b) and b.grad is None for a, b in zip(before, net.parameters(), strict=True))
    assert all(b.attn.fused_attn for b in net.blocks)  # type: ignore[union-attr]  # a copy was unfused, not the net
    reference = dense_reference(net, dataset())
    assert list(reference) == ["block_01", "block_02"]
    worst = {"token": 0.0, "norm": 0.0}
    for point, want in reference.items():
        got = results[(point, "all")]
        s = want["singular"]  # [images * tokens, D]
        np.testing.assert_allclose(got.kept_arrays["block_jacobian_singular_values"], s, rtol=1e-11, atol=0)
        samples = {
            "block_jacobian_sigma_max": s[:, 0],
            "block_jacobian_sigma_min": s[:, -1],
            "block_jacobian_log_det": np.log(s).sum(axis=1),
            "block_jacobian_condition": s[:, 0] / s[:, -1],
            "block_jacobian_norm": want["norm"],
        }
        for m in BLOCK_JACOBIAN_METRICS:
            value, stderr = spread(samples[m])
            rel = 1e-9 if m == "block_jacobian_norm" else 1e-11  # Lanczos to its tolerance vs exact SVD
            assert got.observables[m] == pytest.approx(value, rel=rel), (point, m)
            assert got.stderr[m] == pytest.approx(stderr, rel=1e-9, abs=1e-14), (point, m)
            key = "norm" if m == "block_jacobian_norm" else "token"
            worst[key] = max(worst[key], abs(got.observables[m] - value) / abs(value))
        lanczos = got.arrays["block_jacobian_lanczos"]
        np.testing.assert_allclose(lanczos[:, 0], want["norm"], rtol=1e-9)
        assert np.all(lanczos[:, 1] <= 1e-3 * lanczos[:, 0] ** 2) and np.all(lanczos[:, 2] >= 1)
    print(f"max relative difference vs dense autograd: token spectra {worst['token']:.1e}, norm {worst['norm']:.1e}")
    assert "block_jacobian_sigma_max" not in results[("pos_embed", "all")].observables  # not a block
    rows = {(r["point"], r["metric"]) for r in read_metric_rows(tmp_path) if r["view"] == "all"}
    assert {(p, m) for p in reference for m in BLOCK_JACOBIAN_METRICS} <= rows


def test_the_family_is_exact_on_simulated_ranks(tmp_path):
    """One image: 2 (block, image) tasks on 3 ranks, so one rank measures nothing and adds zeros; one norm sample, so
    its spread is NaN."""
    settings = config(images=1, tokens=2, lanczos_iterations=8)
    check = check_family(BLOCK_JACOBIAN, tiny_vit(), dataset(), tmp_path, settings=settings, world_size=3)
    assert math.isnan(check.single[0][("block_01", "all")].stderr["block_jacobian_norm"])
    assert {(p, m) for p, _, m in check.metrics} == {
        (p, m) for p in ("block_01", "block_02") for m in BLOCK_JACOBIAN_METRICS
    }


def test_positions_schedule_settings_and_panels():
    assert token_positions(197, 2) == [0, 98] and token_positions(17, 1) == [0] and token_positions(3, 5) == [0, 1, 2]
    every_third = ObservationSettings.from_config({"every_n_epochs": 1, "block_jacobian": {"every_n_observations": 3}})
    assert [jacobian_due(every_third, e) for e in (0, 1, 2, 3, 6, None)] == [True, False, False, True, True, True]
    assert BLOCK_JACOBIAN not in enabled_families(ObservationSettings())  # off until make bench has measured it
    assert BLOCK_JACOBIAN.order == 120 and BLOCK_JACOBIAN.series == ("epoch",)
    for bad in ({"tokens": 0}, {"chunk": 1.5}, {"lanczos_tol": 1.0}, {"seed": -1}, {"enabled": "yes"}):
        with pytest.raises(ObservationSettingsError, match=r"block_jacobian\."):
            BlockJacobianSettings(**bad)
    declared = {(p.kind, p.metric) for p in panels.declared() if p.metric.startswith("block_jacobian")}
    assert {("depth", "block_jacobian_sigma_max"), ("depth", "block_jacobian_norm")} <= declared
