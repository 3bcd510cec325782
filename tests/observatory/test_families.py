"""The measurement-family seam: the family tester on the image-vector family and on a toy family, the registry,
and the reduction of family states when there are no covariances."""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
from torch.utils.data import TensorDataset

from tests.observatory.mean_norm_family import MeanNormFamily
from tgo.observatory.families import (
    IMAGE_VECTORS,
    SummedTensors,
    jackknife_ratio,
    register_family,
    registered_families,
    unregister_family,
)
from tgo.observatory.families.testing import check_family, simulated_ranks
from tgo.spectral import CATALOGUE, jackknife_stderr
from tgo.spectral.accumulator import allreduce_accumulators

N_IMAGES = 7  # 3 + 2 + 2 images on 3 simulated ranks


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3
    ).eval()


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(N_IMAGES, 3, 16, 16, generator=g), torch.arange(N_IMAGES) % 3)


# The toy family: recipe (e) of docs/extending.md, defined once in tests/observatory/mean_norm_family.py.


@pytest.fixture
def mean_norm():
    family = register_family(MeanNormFamily())
    try:
        yield family
    finally:
        unregister_family(family.name)


def test_the_toy_family_passes_the_family_tester(tmp_path, mean_norm):
    check = check_family(mean_norm, _net(), _data(), tmp_path, settings={"groups": 3, "probes": {"enabled": False}})
    assert check.calls and all(len(c) == 2 for c in check.calls)
    block = check.single[0][("block_01", "all")]
    # the value is the mean row norm, its standard error the jackknife of the group replicates
    assert block.observables["mean_token_norm"] > 0 and math.isfinite(block.stderr["mean_token_norm"])
    assert jackknife_stderr(block.jackknife["mean_token_norm"]) == block.stderr["mean_token_norm"]
    assert {m for _, _, m in check.metrics} == {"mean_token_norm"}


def test_the_image_vector_family_passes_the_family_tester(tmp_path):
    settings = {"groups": 3, "probes": {"folds": 3, "subspace_k": 4}}
    check = check_family(IMAGE_VECTORS, _net(), _data(), tmp_path, settings=settings)
    views = {view for _, view, _ in check.metrics}
    assert views == {"all", "cls", "patch"}
    resumed = check.resumed[("block_02", "all")]
    assert resumed.observables["subspace_overlap_prev"] == pytest.approx(1.0)  # the same weights, from the records


def test_the_registry_adds_and_removes_the_catalogue_entries():
    assert registered_families()[0] is IMAGE_VECTORS
    family = register_family(MeanNormFamily())
    try:
        assert "mean_token_norm" in CATALOGUE and CATALOGUE["mean_token_norm"].scope == "family"
        with pytest.raises(ValueError, match="already registered"):
            register_family(MeanNormFamily())
    finally:
        unregister_family(family.name)
    assert "mean_token_norm" not in CATALOGUE


def test_every_module_of_the_package_registers_its_family_and_the_registry_keeps_their_order():
    """Discovery: each module of `tgo.observatory.families` but the protocol's registers one family (a new family is
    one new file); the registry, the catalogue and the settings sections follow ``order`` whatever the registration
    order, and two families of one order are refused by name."""
    import pkgutil

    import tgo.observatory.families as package
    from tgo.observatory import ObservationSettings

    modules = {m.name for m in pkgutil.iter_modules(package.__path__)} - {"base", "testing", "weight_history"}
    families = registered_families()
    assert {type(f).__module__.rsplit(".", 1)[1] for f in families} == modules
    assert [f.order for f in families] == sorted(f.order for f in families)
    assert package.ATTENTION is package.attention.ATTENTION
    with pytest.raises(AttributeError):
        package.NOT_A_FAMILY  # noqa: B018
    first = type("First", (MeanNormFamily,), {"name": "first", "order": 5, "settings": package.PHASES.settings})
    catalogue_before = CATALOGUE.names
    family = register_family(first())  # registered last, ordered first
    try:
        assert registered_families() == (family, *families)
        assert CATALOGUE.names.index("mean_token_norm") < CATALOGUE.names.index("between_image_fraction")
        sections = list(ObservationSettings().to_dict())
        assert sections.index("first") < sections.index(package.IMAGE_VECTORS.settings_key)
        with pytest.raises(ValueError, match="'first' and 'second' both declare order 5"):
            register_family(type("Second", (MeanNormFamily,), {"name": "second", "order": 5})())
    finally:
        unregister_family("first")
    assert registered_families() == families and CATALOGUE.names == catalogue_before


def test_family_states_are_reduced_without_covariances_in_two_collectives():
    """allreduce_accumulators with extras only still sums them (and still makes two collectives)."""

    def work(rank, all_reduce_sum):
        sums = SummedTensors.zeros({"x": (2,)})
        sums["x"][rank % 2] = rank + 1.0
        allreduce_accumulators([], all_reduce_sum, [sums])
        return sums["x"].clone()

    out, calls = simulated_ranks(3, work)
    assert all(len(c) == 2 for c in calls)
    for x in out:
        np.testing.assert_array_equal(x.numpy(), [1.0 + 3.0, 2.0])


def test_jackknife_ratio_matches_the_definition():
    num, den = np.array([1.0, 2.0, 4.0]), np.array([1.0, 1.0, 2.0])
    value, stderr, replicates = jackknife_ratio(num, den)
    assert value == 7.0 / 4.0
    np.testing.assert_allclose(replicates, [6.0 / 3.0, 5.0 / 3.0, 3.0 / 2.0])
    assert stderr == jackknife_stderr(replicates)
    assert jackknife_ratio(num[:1], den[:1])[1:] == (pytest.approx(math.nan, nan_ok=True), None)


# ------------------------------------------------------------------------ a family's own declaration (issue 35 item 1)
def test_a_family_declares_its_settings_series_and_figure_switch_and_unregistering_removes_them():
    """A family's settings section is ``observation.<name>.*`` once it is registered (validated by its own dataclass,
    read as ``settings.<name>``, enabling it), its ``series`` decides the step series, and its figure switch joins
    ``observation.figures``; unregistering removes all three."""
    import dataclasses

    from tgo.observatory import ObservationSettings, ObservationSettingsError
    from tgo.observatory.families import enabled_families

    @dataclasses.dataclass(frozen=True)
    class ToySettings:
        enabled: bool = True
        scale: int = 2

        def __post_init__(self) -> None:
            if self.scale < 1:
                raise ObservationSettingsError(f"observation.toy.scale: expected >= 1, got {self.scale}")

    class Toy(MeanNormFamily):
        name, settings, series, figure_switch = "toy", ToySettings, ("epoch",), True

    with pytest.raises(ObservationSettingsError, match=r"^observation\.toy: unknown setting"):
        ObservationSettings.from_config({"toy": {}})
    toy = register_family(Toy())
    try:
        settings = ObservationSettings.from_config({"toy": {"scale": 3}, "figures": {"toy": False}})
        assert settings.toy == ToySettings(scale=3) and settings.figures.toy is False
        assert ObservationSettings.from_config(settings.to_dict()) == settings
        assert toy in enabled_families(settings) and toy not in enabled_families(settings, "step")
        assert toy not in enabled_families(settings.replace(toy={"enabled": False}))
        with pytest.raises(ObservationSettingsError, match=r"^observation\.toy\.scale: expected >= 1"):
            settings.replace(toy={"scale": 0})
        with pytest.raises(ValueError, match="already a setting"):
            other = {"name": "other", "order": 901, "settings": int, "section": "toy"}
            register_family(type("Other", (MeanNormFamily,), other)())
    finally:
        unregister_family("toy")
    assert "toy" not in ObservationSettings().to_dict() and "toy" not in ObservationSettings().to_dict()["figures"]
    assert "other" not in {f.name for f in registered_families()}
