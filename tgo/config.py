"""Fail-fast validation of a composed config, before any data is read or any weight is updated.

Hydra checks that keys exist; it does not check that values make sense. A zero batch size or a negative epoch
count would otherwise surface minutes later as an obscure error deep inside Lightning, or worse, silently run
nothing. Each rule names the key and what was expected, and ``validate_config`` raises one ``ConfigError``
listing every problem at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from tgo.errors import ConfigError
from tgo.observatory.settings import ObservationSettings, ObservationSettingsError

_MISSING = object()


def _positive_int(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return f"expected a positive integer, got {value!r}"
    return None


def _optional_positive_int(value: Any) -> str | None:
    return None if value is None else _positive_int(value)


def _devices(value: Any) -> str | None:
    if value == "auto" or value == -1:
        return None
    if isinstance(value, (list, tuple)) or OmegaConf.is_list(value):
        return None if len(value) > 0 else "expected a non-empty list of device ids"
    return _positive_int(value)


def _int(value: Any) -> str | None:
    return None if isinstance(value, int) and not isinstance(value, bool) else f"expected an integer, got {value!r}"


def _limit(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return f"expected null, a positive number of batches or a fraction in (0, 1], got {value!r}"
    return None


# key -> rule; a key absent from the config is skipped (callbacks can be disabled with null).
RULES: dict[str, Callable[[Any], str | None]] = {
    "seed": _int,
    "trainer.max_epochs": _positive_int,
    "trainer.devices": _devices,
    "trainer.num_nodes": _positive_int,
    "trainer.limit_train_batches": _limit,
    "trainer.limit_val_batches": _limit,
    "data.batch_size": _positive_int,
    "data.image_size": _positive_int,
    "data.analysis.size": _optional_positive_int,
    "data.analysis.per_class": _optional_positive_int,
    "callbacks.trajectory_checkpoint.every_n_epochs": _optional_positive_int,
}


def _select(cfg: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=True)
    except MissingMandatoryValue:
        raise ConfigError(f"{key}: a value is required (it is ??? in the config); pass {key}=...") from None


def validate_config(cfg: DictConfig) -> None:
    """Checks the composed config and raises one ``ConfigError`` naming every bad key and what was expected.

    Args:
        cfg: The composed Hydra config of ``tgo.train``.

    Raises:
        ConfigError: If a mandatory value is missing or any value breaks its rule.
    """
    problems = []
    for key, rule in RULES.items():
        value = _select(cfg, key)
        if value is _MISSING:
            continue
        message = rule(value)
        if message:
            problems.append(f"{key}: {message}")
    for key in ("data.root",):
        _select(cfg, key)  # raises on ??? (tgo1 needs the dataset location)
    if "observation" in cfg:
        try:
            ObservationSettings.from_config(cfg.observation)
        except ObservationSettingsError as err:
            problems.append(str(err))
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems) if len(problems) > 1 else problems[0])
