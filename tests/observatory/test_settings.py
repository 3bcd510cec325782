"""ObservationSettings: one validated place; every bad value is one error naming observation.<key>."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from tgo.observatory import ObservationSettings, ObservationSettingsError


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"every_n_epochs": 0}, "every_n_epochs"),
        ({"gram_dtype": "float16"}, "gram_dtype"),
        ({"batch_size": -1}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"nonfinite": "ignore"}, "nonfinite"),
        ({"keep_covariance": "sometimes"}, "keep_covariance"),
        ({"keep_covariance": [0, -3]}, "keep_covariance"),
        ({"fit_range": [5, 2]}, "fit_range"),
        ({"groups": 1}, "groups"),
        ({"groups": -2}, "groups"),
        ({"figures": {"every_n_observations": 0}}, "figures.every_n_observations"),
        ({"figures": {"spectra": "yes"}}, "figures.spectra"),
        ({"figures": {"colour": True}}, "figures.colour"),
        ({"every_n_epoch": 3}, "every_n_epoch"),
    ],
)
def test_bad_values_name_their_key(values: dict, key: str) -> None:
    with pytest.raises(ObservationSettingsError, match=rf"^observation\.{key}: "):
        ObservationSettings.from_config(values)


def test_round_trip_and_covariance_policies() -> None:
    settings = ObservationSettings.from_config({"keep_covariance": [0, 10], "fit_range": [1, 20], "groups": 0})
    assert ObservationSettings.from_config(settings.to_dict()) == settings
    assert settings.keeps_covariance(10, first=False, last=False) and not settings.keeps_covariance(
        5, first=True, last=True
    )
    default = ObservationSettings()
    assert default.groups == 10 and default.keeps_covariance(0, first=True, last=False)
    assert not default.keeps_covariance(5, first=False, last=False)
    assert ObservationSettings(keep_covariance="all").keeps_covariance(5, first=False, last=False)
    assert not ObservationSettings(keep_covariance="none").keeps_covariance(0, first=True, last=True)
    assert default.replace(gram_dtype="float32").gram_dtype == "float32" and settings.fit_range == (1, 20)


# ------------------------------------------------------------------------- impossible settings (issue 33, item 6)
def test_more_jackknife_groups_than_analysis_images_are_refused_before_any_forward(tmp_path):
    """Before: ``groups=1000`` with 50 images was accepted (950 empty groups, standard errors from nothing)."""
    import tgo
    from tests.observatory.observatory_helpers import hook_count
    from tests.processes import tiny_vit

    net = tiny_vit()
    forwards: list[int] = []
    net.register_forward_pre_hook(lambda module, args: forwards.append(1))
    images = TensorDataset(torch.randn(50, 3, 16, 16), torch.arange(50) % 5)
    hooks = hook_count(net)
    with pytest.raises(ObservationSettingsError) as err:
        tgo.observe_model(net, images, out=tmp_path / "run", groups=1000, probes={"enabled": False})
    assert str(err.value) == (
        "observation.groups: 1000 jackknife groups for 50 analysis images would leave 950 groups empty; expected at "
        "most 50 (one image per group at least), or 0 for no jackknife"
    )
    assert not forwards and hook_count(net) == hooks
    assert not (tmp_path / "run" / "geometry").exists()


def test_as_many_groups_as_images_leaves_none_empty_and_one_more_is_refused():
    """The boundary is where the class-stratified deal starts leaving a group empty (counted independently)."""
    from tgo.observatory.pipeline import group_of_items

    labels = np.repeat(np.arange(5), 10)  # 5 classes of 10: fewer per class than groups, still no empty group
    items = TensorDataset(torch.zeros(50, 1), torch.as_tensor(labels))
    assert np.bincount(group_of_items(items, 50), minlength=50).min() == 1
    with pytest.raises(ObservationSettingsError, match=r"51 jackknife groups for 50 analysis images would leave 1 "):
        group_of_items(items, 51)
