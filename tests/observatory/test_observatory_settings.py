"""ObservationSettings: one validated place; every bad value is one error naming observation.<key>."""

from __future__ import annotations

import pytest

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
    assert default.replace(gram_dtype="float32").summary_kwargs() == {}
    assert settings.summary_kwargs() == {"fit_range": (1, 20)}
