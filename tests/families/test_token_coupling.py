"""The token-coupling family: the T x T token covariance streamed as sums equals numpy's two-pass covariance of the
same tokens materialised (both centrings, every metric, its jackknife error and replicates, the spectrum), 1 process
= 2 or 3 simulated ranks with the same two collectives (`check_family`), recorded, and declared as panels."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from torch.utils.data import TensorDataset

from tgo import panels
from tgo.observatory.families import enabled_families
from tgo.observatory.families.testing import check_family
from tgo.observatory.families.token_coupling import TOKEN_COUPLING, TokenCouplingSettings
from tgo.observatory.pipeline import RecordPlan, ShardPlan, group_of_items, observe_and_record
from tgo.observatory.points import vit_points
from tgo.observatory.settings import ObservationSettings, ObservationSettingsError
from tgo.records import RecordWriter, read_metric_rows
from tgo.spectral.token_coupling import COUPLING_METRICS, TokenSums, token_covariance

GROUPS, N_IMAGES, WIDTH = 3, 10, 16
POINTS = ("patch_embed", "pos_embed", "block_01", "block_02")  # every point that keeps all its tokens


def tiny_vit() -> torch.nn.Module:
    """A float64 2-block ViT at 16 px, patch 4 (16 patches + CLS = 17 tokens of 16 channels)."""
    torch.manual_seed(0)
    net = timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=WIDTH, depth=2, num_heads=2, num_classes=3
    )
    return net.double().eval()


def images() -> TensorDataset:
    x = torch.randn(N_IMAGES, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return TensorDataset(x, torch.arange(N_IMAGES) % 3)


def config(centering: str = "pooled") -> dict:
    return {
        "groups": GROUPS,
        "probes": {"enabled": False},
        "attention": {"enabled": False},
        "token_coupling": {"enabled": True, "centering": centering},
    }


def tokens_of(net: torch.nn.Module, x: torch.Tensor) -> dict[str, np.ndarray]:
    """Every measured point's tokens ``[n, T, D]``, materialised by plain forward hooks on the whole set at once."""
    out: dict[str, np.ndarray] = {}

    def keep(name: str):
        def hook(module, args, output=None):
            out[name] = (args[0] if output is None else output).detach().numpy().copy()

        return hook

    handles = [
        net.patch_embed.register_forward_hook(keep("patch_embed")),
        net.pos_drop.register_forward_pre_hook(keep("pos_embed")),
        *(b.register_forward_hook(keep(f"block_{i + 1:02d}")) for i, b in enumerate(net.blocks)),
    ]
    with torch.no_grad():
        net(x)
    for h in handles:
        h.remove()
    return out


def reference_covariance(x: np.ndarray, centering: str) -> np.ndarray:
    """numpy's two-pass covariance: ``pooled`` of the ``n D`` (image, channel) observations of the T tokens;
    ``per_image`` TGO-II's mean over images of each image's token covariance over its channels."""
    n, t, d = x.shape
    if centering == "pooled":
        return np.cov(x.transpose(0, 2, 1).reshape(n * d, t), rowvar=False)
    return np.mean([np.cov(image) for image in x], axis=0)


def reference_metrics(cov: np.ndarray) -> tuple[dict[str, float], np.ndarray]:
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    squares = corr**2
    eigs = np.clip(np.sort(np.linalg.eigvalsh(cov))[::-1], 0, None)
    p = eigs[eigs > 0] / eigs.sum()
    absolute = np.abs(cov)
    return {
        "token_offdiag_fraction": (squares.sum() - np.trace(squares)) / squares.sum(),
        "token_coupling_ratio": (absolute.sum() - np.trace(absolute)) / absolute.sum(),
        "token_effective_rank": math.exp(-(p * np.log(p)).sum()),
    }, eigs


def observe(net, data, run_dir: Path, centering: str):
    return observe_and_record(
        net,
        data,
        vit_points(net),
        settings=ObservationSettings.from_config(config(centering)),
        plan=ShardPlan(0, 1, 4),
        record=RecordPlan(RecordWriter(run_dir), epoch=0, step=0, with_covariance=True),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )


@pytest.mark.parametrize("centering", ["pooled", "per_image"])
def test_every_metric_equals_numpy_on_the_tokens_materialised(tmp_path, centering):
    net, data = tiny_vit(), images()
    results = observe(net, data, tmp_path, centering)
    tokens = tokens_of(net, data.tensors[0])
    group_of = group_of_items(data, GROUPS)
    worst = 0.0
    for point in POINTS:
        x = tokens[point]
        got = results[(point, "all")]
        want, eigs = reference_metrics(reference_covariance(x, centering))
        np.testing.assert_allclose(got.kept_arrays["token_eigenvalues"], eigs, rtol=0, atol=1e-12 * eigs[0])
        leave_out = [reference_metrics(reference_covariance(x[group_of != g], centering))[0] for g in range(GROUPS)]
        for m in COUPLING_METRICS:
            replicates = np.array([r[m] for r in leave_out])
            stderr = math.sqrt((GROUPS - 1) / GROUPS * ((replicates - replicates.mean()) ** 2).sum())
            assert got.observables[m] == pytest.approx(want[m], rel=1e-12), (point, m)
            assert got.stderr[m] == pytest.approx(stderr, rel=1e-10, abs=1e-14), (point, m)
            np.testing.assert_allclose(got.jackknife[m], replicates, rtol=1e-12)
            worst = max(worst, abs(got.observables[m] - want[m]) / abs(want[m]))
    assert worst < 1e-12
    assert "token_offdiag_fraction" not in results[("cls", "all")].observables  # one token: no token covariance
    assert results[("patch_embed", "all")].kept_arrays["token_eigenvalues"].shape == (16,)  # no CLS there
    rows = {(r["point"], r["metric"]) for r in read_metric_rows(tmp_path) if r["view"] == "all"}
    assert {(p, m) for p in POINTS for m in COUPLING_METRICS} <= rows


def test_the_family_is_exact_on_simulated_ranks(tmp_path):
    check = check_family(TOKEN_COUPLING, tiny_vit(), images(), tmp_path, settings=config(), world_size=3)
    assert {(p, m) for p, _, m in check.metrics} == {(p, m) for p in POINTS for m in COUPLING_METRICS}
    assert all(len(c) == 2 for c in check.calls)


@pytest.mark.parametrize(("centering", "offset"), [("pooled", 1e2), ("per_image", 1e4)])
def test_the_sums_keep_their_precision_away_from_zero(centering, offset):
    """Tokens offset far from zero: within an image each token is centred before its Gram, so ``per_image`` loses
    nothing; ``pooled``'s between-image term loses ~eps (offset / spread)^2 of the scale (docs:
    ~1e-12 at a ratio of 100)."""
    rng = np.random.default_rng(0)
    x = offset + rng.normal(size=(12, 5, 7)) * np.linspace(0.5, 2.0, 5)[None, :, None]
    sums = TokenSums(2, 5, centering)
    sums.update(torch.from_numpy(x[:7]), [(0, 0, 2), (1, 2, 5), (0, 5, 7)])
    sums.update(torch.from_numpy(x[7:]))
    got, _ = token_covariance({k: v.sum(axis=0) for k, v in sums.numpy().items()}, centering)
    want = reference_covariance(x, centering)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-11 * np.abs(want).max())


def test_settings_panels_and_refusal():
    assert TokenCouplingSettings() == TokenCouplingSettings(enabled=False, centering="pooled")
    assert TOKEN_COUPLING not in enabled_families(ObservationSettings())  # off until make bench has measured it
    with pytest.raises(ObservationSettingsError, match=r"token_coupling\.centering"):
        TokenCouplingSettings(centering="per_token")
    with pytest.raises(ObservationSettingsError, match=r"token_coupling\.enabled"):
        TokenCouplingSettings(enabled="yes")  # type: ignore[arg-type]
    declared = {(p.kind, p.metric) for p in panels.declared() if p.metric.startswith("token_")}
    assert {("depth", "token_offdiag_fraction"), ("bands", "token_offdiag_fraction")} <= declared
    with pytest.raises(ValueError, match=r"expected \[B, 5, D\]"):
        TokenSums(1, 5, "pooled").update(torch.zeros(2, 4, 3))
