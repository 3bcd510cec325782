"""Every timm Vision Transformer family TGO supports, observed whole; everything else refused in one line.

Like timm's own model tests, each family is built tiny (16 px, patch 4: 16 patches, width 16, 2 blocks, 2 heads) and
observed with the probes and the jackknife on, through `observe_and_record` into a run directory. Each must give
records whose observables are finite, with the row count of every view right: a sequence point's ``patch`` view has
``B * (N - num_prefix_tokens)`` rows (every class, register and distillation token removed), its ``prefix`` view
``B * num_prefix_tokens`` (only with more than one prefix token), its ``cls`` view ``B``; the final point is ``cls``
where the head reads the class token and ``pooled`` (the output of ``fc_norm``) where it pools. The registers' patch
and prefix covariances are also checked against ``np.cov`` of the very activations of the pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import timm
import torch
from torch.utils.data import TensorDataset

from tgo.checkpoints import timm_net
from tgo.errors import UserInputError
from tgo.model import build_timm_model
from tgo.observatory import ObservationKey, points_from_config, vit_points
from tgo.observatory.families.attention import attention_refusal
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
from tgo.observatory.settings import ObservationSettings
from tgo.records import RecordWriter, load_metrics, load_series, load_spectra
from tgo.vit_families import UnsupportedModelError, check_timm_name

IMG, PATCH, N_PATCHES = 16, 4, 16
TINY: dict[str, Any] = dict(img_size=IMG, patch_size=PATCH, embed_dim=16, depth=2, num_heads=2)
N_IMAGES, N_CLASSES = 8, 4
SETTINGS = ObservationSettings(groups=2, probes={"folds": 2, "subspace_k": 3})


@dataclass(frozen=True)
class Family:
    id: str
    name: str
    prefix: int  # num_prefix_tokens
    final: str  # the final point: cls or pooled
    kwargs: dict[str, Any] = field(default_factory=dict)


FAMILIES = [
    Family("vit", "vit_tiny_patch16_224", 1, "cls"),
    Family("vit_no_class_token", "vit_tiny_patch16_224", 0, "pooled", dict(class_token=False, global_pool="avg")),
    Family("vit_registers", "vit_tiny_patch16_224", 5, "cls", dict(reg_tokens=4)),
    Family("deit_distilled", "deit_tiny_distilled_patch16_224", 2, "cls"),
    Family("deit3", "deit3_small_patch16_224", 1, "cls"),
    Family("flexivit", "flexivit_small", 1, "cls"),
    Family("siglip", "vit_base_patch16_siglip_224", 0, "pooled"),
    Family("eva02", "eva02_tiny_patch14_224", 1, "pooled"),
    Family("eva_rope_register_no_class_token", "vit_base_patch16_rope_reg1_gap_256", 1, "pooled"),
    Family("beit", "beit_base_patch16_224", 1, "pooled"),
]


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    labels = torch.arange(N_IMAGES) % N_CLASSES
    return TensorDataset(torch.randn(N_IMAGES, 3, IMG, IMG, generator=g), labels)


def _build(family: Family) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_timm_model(family.name, num_classes=0, in_chans=3, **TINY, **family.kwargs).eval()


class _Blocks:
    """Forward hooks (not TGO's probe) keeping every block's output of the pass, in float64, in batch order."""

    def __init__(self, net: torch.nn.Module) -> None:
        self.seen: dict[int, list[torch.Tensor]] = {}
        self.handles = [
            block.register_forward_hook(lambda _m, _a, out, i=i: self.seen.setdefault(i, []).append(out.double()))
            for i, block in enumerate(net.blocks)
        ]

    def rows(self, i: int) -> np.ndarray:
        for h in self.handles:
            h.remove()
        return torch.cat(self.seen[i]).detach().numpy()  # [B, N, D]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.id for f in FAMILIES])
def observed(request, tmp_path_factory) -> dict[str, Any]:
    family: Family = request.param
    net = _build(family)
    run = tmp_path_factory.mktemp(family.id)
    capture = _Blocks(net)
    results = observe_and_record(
        net,
        _dataset(),
        vit_points(net),
        settings=SETTINGS,
        plan=ShardPlan(batch_size=5),
        record=RecordPlan(RecordWriter(run), epoch=0, step=0, with_covariance=True),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )
    return {"family": family, "net": net, "run": run, "results": results, "block_rows": capture.rows(0)}


def test_points_name_what_they_read(observed):
    family, net = observed["family"], observed["net"]
    assert net.num_prefix_tokens == family.prefix
    names = [p.name for p in vit_points(net)]
    assert names == ["patch_embed", "pos_embed", "block_01", "block_02", family.final]
    assert points_from_config({"preset": "vit"}, net) == vit_points(net)


def test_every_view_has_the_right_rows_and_finite_observables(observed):
    family, results = observed["family"], observed["results"]
    b, p, n = N_IMAGES, family.prefix, N_PATCHES + family.prefix
    cls, prefix = observed["net"].cls_token is not None, p > 1 or (p == 1 and observed["net"].cls_token is None)
    views = {key.view for key in results if key.point == "block_01"}
    want = {"all", "patch", "between_image", "within_image"} | ({"cls"} if cls else set())
    standard = attention_refusal(observed["net"].blocks[0].attn) is None  # timm's Attention: the attention family
    assert standard == (family.id not in ("eva02", "eva_rope_register_no_class_token", "beit")), family.id
    weights = {v for v in views if v.startswith("weights_")}  # the weights family: the block's Linear maps
    assert weights and weights <= {"weights_qkv", "weights_proj", "weights_fc1", "weights_fc2"}
    assert views - weights == want | ({"prefix"} if prefix else set()) | ({"attention"} if standard else set())
    for point in ("pos_embed", "block_01", "block_02"):
        assert results[ObservationKey(point, "all")].n_rows == b * n
        assert results[ObservationKey(point, "patch")].n_rows == b * (n - p)
        if cls:
            assert results[ObservationKey(point, "cls")].n_rows == b
        if prefix:
            assert results[ObservationKey(point, "prefix")].n_rows == b * p
    assert results[ObservationKey("patch_embed", "patch")].n_rows == b * N_PATCHES
    assert results[ObservationKey(family.final, "all")].n_rows == b
    for key, result in results.items():
        if key.view in ("all", "patch", "prefix") and result.n_rows > 16:  # full-rank covariances: D = 16
            for metric in ("effective_rank", "stable_rank", "participation_ratio", "spectral_entropy"):
                assert math.isfinite(result.observables[metric]), (key, metric)
                assert math.isfinite(result.stderr[metric]), (key, metric)


def test_the_records_hold_every_view_and_read_back(observed):
    family, results, run = observed["family"], observed["results"], observed["run"]
    frame = load_metrics(run)
    assert set(zip(frame["point"], frame["view"], strict=True)) == {(k.point, k.view) for k in results}
    blocks = sorted(k.point for k in results if k.view == "attention")
    assert sorted(load_series(run, view="attention").get("attention_entropy", {})) == blocks
    for view in {k.view for k, r in results.items() if r.has_covariance}:  # attention, weights_*: no covariance
        series = load_series(run, view=view)
        spectra = load_spectra(run, view=view)[0]
        points = {k.point for k in results if k.view == view}
        assert set(series["effective_rank"]) == points == set(spectra)
        for point in points:
            want = results[ObservationKey(point, view)].spectrum.eigenvalues
            np.testing.assert_array_equal(spectra[point]["eigenvalues"], want)
    registers_only = family.prefix == 1 and observed["net"].cls_token is None
    assert ("prefix" in set(frame["view"])) == (family.prefix > 1 or registers_only)


def test_patch_and_prefix_views_are_the_covariances_of_those_tokens(observed):
    family, results = observed["family"], observed["results"]
    x = observed["block_rows"]  # [B, N, D]: block_01's output in the pass
    p = family.prefix
    want = {"all": x, "patch": x[:, p:]}
    if ObservationKey("block_01", "prefix") in results:
        want["prefix"] = x[:, :p]
    for view, rows in want.items():
        flat = rows.reshape(-1, rows.shape[-1])
        got = results[ObservationKey("block_01", view)].covariance
        ref = np.cov(flat, rowvar=False)
        assert np.max(np.abs(got - ref)) <= 1e-9 * np.max(np.abs(ref)), view


def test_the_final_point_is_what_the_head_sees(observed):
    family, net, results = observed["family"], observed["net"], observed["results"]
    pixels = _dataset().tensors[0]
    with torch.no_grad():
        features = net.forward_features(pixels)
        seen = features[:, 0] if family.final == "cls" else net.forward_head(features, pre_logits=True)
    want = seen.double().numpy().mean(axis=0)
    np.testing.assert_allclose(results[ObservationKey(family.final)].mean, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------------- refusals
REFUSED = [
    ("resnet18", r"resnet18 \(timm\.models\.resnet\) is not one$"),
    ("convnext_atto", r"convnext_atto \(timm\.models\.convnext\) is not one$"),
    ("vit_relpos_small_patch16_224", r"is not one: it has no position-embedded token sequence"),
    ("vit_tiny_r_s16_p8_224", r"is not one: its patch embedding is a CNN backbone"),
    ("samvit_base_patch16", r"is not one: SAM's image encoder"),
]


@pytest.mark.parametrize(("name", "match"), REFUSED, ids=[n for n, _ in REFUSED])
def test_other_models_are_refused_in_one_line_naming_the_families(name, match):
    for build in (
        lambda: check_timm_name(name),
        lambda: build_timm_model(name, num_classes=3, img_size=IMG),
        lambda: timm_net(name, pretrained=False, weights=None, seed=0, img_size=IMG, in_chans=3, arch={}),
    ):
        with pytest.raises(UnsupportedModelError, match=match) as err:
            build()
        message = str(err.value)
        assert "\n" not in message and isinstance(err.value, UserInputError) and isinstance(err.value, TypeError)
        assert message.startswith("only timm Vision Transformers are supported (VisionTransformer")
        assert "DeiT distilled" in message and "EVA" in message and "img_size" not in message


def test_built_non_vits_are_refused_by_the_preset():
    resnet = timm.create_model("resnet18", num_classes=0)
    with pytest.raises(UnsupportedModelError, match=r"supported \(.*\): ResNet is not one$"):
        vit_points(resnet)
    with pytest.raises(UnsupportedModelError, match="ResNet is not one"):
        points_from_config({"preset": "vit"}, resnet)
    hybrid = timm.create_model("vit_tiny_r_s16_p8_224", img_size=32, embed_dim=16, depth=1, num_heads=2)
    with pytest.raises(UnsupportedModelError, match="VisionTransformer is not one: its patch embedding is a CNN"):
        vit_points(hybrid)
    assert points_from_config({"preset": None, "extra": [{"name": "layer1", "module": "layer1"}]}, resnet)


def test_the_report_says_why_cls_claims_are_not_judged_at_a_pooled_point(observed):
    from tgo.report.findings import NA, evaluate_findings

    family, results = observed["family"], observed["results"]
    points = list(dict.fromkeys(k.point for k in results))
    rows = [f for f in evaluate_findings(load_series(observed["run"]), points) if f.claim == "cls_extreme"]
    if family.final == "cls":
        assert rows and all(f.point == "cls" for f in rows)
    else:
        assert rows and all(f.point == "pooled" and f.verdict == NA and "reads no class token" in f.note for f in rows)
