"""``ObservationSettings``: every knob of a geometry observation, validated in one place.

The training callback and ``python -m tgo.observe`` read the same config group, ``conf/observation/default.yaml``, which
documents every core key. A family's section (``observation.<section>.<key>``) is a frozen dataclass declared in the
family's own file and registered with `register_section`; its defaults reach Hydra from the dataclass
(`_publish_to_hydra`), so no YAML file names a family. Errors name the key as a user spells it
(``observation.gram_dtype: expected ...``) and are raised before any work starts."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from tgo.errors import UserInputError

__all__ = [
    "COMPUTE_DTYPES",
    "COVARIANCE_POLICIES",
    "EIGENSOLVERS",
    "GRAM_DTYPES",
    "NONFINITE_POLICIES",
    "PREFIX",
    "EarlySettings",
    "FigureSettings",
    "ObservationSettings",
    "ObservationSettingsError",
    "SummarySettings",
    "check_flags",
    "compute_dtype",
    "is_int",
    "one_of",
    "positive_int",
    "register_figure_switch",
    "register_section",
    "unregister_extras",
]

GRAM_DTYPES: dict[str, torch.dtype] = {"float64": torch.float64, "float32": torch.float32}
NONFINITE_POLICIES: tuple[str, ...] = ("warn", "error")
COVARIANCE_POLICIES: tuple[str, ...] = ("first_last", "all", "none")
COMPUTE_DTYPES: tuple[str, ...] = ("auto", "float64", "float32")  # a family's compute precision (`compute_dtype`)
PREFIX = "observation"


class ObservationSettingsError(UserInputError):
    """An observation setting is unknown or out of range; the message names ``observation.<key>``."""


def check_jackknife_groups(groups: int, images: int) -> None:
    """Refuses more jackknife groups than analysis images (``G - images`` groups would be empty, their leave-one-out
    spectra copies of the full one: a standard error computed from nothing), before any image is observed."""
    if groups and groups > images:
        raise ObservationSettingsError(
            f"{PREFIX}.groups: {groups} jackknife groups for {images} analysis images would leave {groups - images} "
            f"groups empty; expected at most {images} (one image per group at least), or 0 for no jackknife"
        )


def is_int(value: Any) -> bool:
    """An integer that is not a bool (YAML's ``true`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(key: str, value: Any) -> None:
    """Refuses ``observation.<key>`` unless it is an integer > 0."""
    if not is_int(value) or value <= 0:
        raise ObservationSettingsError(f"{PREFIX}.{key}: expected a positive integer, got {value!r}")


def _optional_positive_int(key: str, value: Any) -> None:
    if value is not None:
        positive_int(key, value)


def one_of(key: str, value: Any, allowed: Sequence[str]) -> None:
    """Refuses ``observation.<key>`` unless it is one of ``allowed``."""
    if value not in allowed:
        raise ObservationSettingsError(f"{PREFIX}.{key}: expected one of {list(allowed)}, got {value!r}")


def check_flags(section: str, settings: Any, *keys: str) -> None:
    """Refuses a switch ``observation.<section>.<key>`` that is not ``true`` or ``false``."""
    for key in keys:
        value = getattr(settings, key)
        if not isinstance(value, bool):
            raise ObservationSettingsError(f"{PREFIX}.{section}.{key}: expected true or false, got {value!r}")


def compute_dtype(dtype: str, device: torch.device | str | None) -> torch.dtype:
    """``auto`` is float64 on an accelerator (whose float64 peak the families' measured costs allow) and float32 on a
    CPU (where torch's float64 costs 1.7-2.5x; each family documents its measured error)."""
    if dtype != "auto":
        return GRAM_DTYPES[dtype]
    kind = torch.device(device).type if device is not None else "cpu"
    return torch.float32 if kind == "cpu" else torch.float64


def _plain(value: Any) -> Any:
    """OmegaConf containers to plain Python (settings are hashable-free plain data)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _reject_unknown(given: Mapping[str, Any], prefix: str, known: list[str]) -> None:
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ObservationSettingsError(f"{prefix}.{unknown[0]}: unknown setting; expected one of {known}")


class _Extended:
    """A frozen dataclass with further keys that the measurement families register when they are registered (kept in
    ``extra``, read as attributes: ``settings.<key>``); keyword arguments take them by that key."""

    extra: Mapping[str, Any]
    _prefix: ClassVar[str]
    _registry: ClassVar[Mapping[str, Callable[[], Any]]]  # key -> its default

    def __init__(self, **values: Any) -> None:
        values = {**values.pop("extra", {}), **values}  # dataclasses.replace passes ``extra`` whole
        own = fields(self)  # type: ignore[arg-type]
        _reject_unknown(values, self._prefix, [*(f.name for f in own if f.name != "extra"), *self._registry])
        for f in own:
            new = f.default_factory
            object.__setattr__(self, f.name, values.get(f.name, f.default if new is MISSING else new()))
        object.__setattr__(self, "extra", {k: values[k] if k in values else new() for k, new in self._registry.items()})
        self.__post_init__()

    def __getattr__(self, name: str) -> Any:
        extra = self.__dict__.get("extra")
        if extra is not None and name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_FIGURE_SWITCHES: dict[str, Callable[[], Any]] = {}  # observation.figures.<key> of the families
_SECTIONS: dict[str, type] = {}  # observation.<key> sections of the families, in registration order


@dataclass(frozen=True, init=False)
class FigureSettings(_Extended):
    """Which TensorBoard figures the callback draws, and how often (``observation.figures``; scalars are never thinned).
    Each switch exists because its cards cost rendering time; ``extra`` holds the families' own switches."""

    _prefix = f"{PREFIX}.figures"
    _registry = _FIGURE_SWITCHES

    every_n_observations: int = 2  # every 2nd observation and the last (docs/usage.md, "What the callback costs")
    story: bool = True
    depth_profiles: bool = True
    bands: bool = True
    spectra: bool = False  # off by default: the detail kinds are drawn once from the records by the report
    histograms: bool = True
    heatmaps: bool = False
    decay: bool = False
    layer_epoch: bool = False
    optimisation: bool = False
    heads: bool = False  # the families' per-head heatmaps (attention, svcca); their depth profiles follow the family
    heatmap_max_dim: int = 384
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        positive_int("figures.every_n_observations", self.every_n_observations)
        positive_int("figures.heatmap_max_dim", self.heatmap_max_dim)
        check_flags("figures", self, *(f.name for f in fields(self) if f.type == "bool"), *self.extra)


@dataclass(frozen=True)
class EarlySettings:
    """The step series: observations at log-spaced optimizer steps early in training (training only), so that a collapse
    during warm-up, between two epoch observations, is not missed (docs/usage.md, "Early training, denser")."""

    enabled: bool = False
    until_step: int | None = None
    per_decade: int = 4

    def __post_init__(self) -> None:
        check_flags("early", self, "enabled")
        _optional_positive_int("early.until_step", self.until_step)
        positive_int("early.per_decade", self.per_decade)

    def steps(self, until_step: int) -> tuple[int, ...]:
        """0 and every distinct ``round(10 ** (k / per_decade))`` up to ``self.until_step``, else ``until_step``."""
        last = int(self.until_step if self.until_step is not None else until_step)
        found = [0]
        k = 0
        while (step := round(10 ** (k / self.per_decade))) <= last:
            if step != found[-1]:
                found.append(step)
            k += 1
        return tuple(found)


EIGENSOLVERS = ("auto", "cpu", "gpu")  # where the summary's float64 eigendecompositions run


@dataclass(frozen=True)
class SummarySettings:
    """Where and when the summary of a reduced observation runs (``observation.summary``).

    ``share`` gives records bitwise those of one process with the ``cpu`` eigensolver (``auto`` on CUDA may choose
    differently on two ranks, each to 1e-9 of LAPACK)."""

    background: bool = True
    share: bool = True
    eigensolver: str = "auto"

    def __post_init__(self) -> None:
        check_flags("summary", self, "background", "share")
        one_of("summary.eigensolver", self.eigensolver, EIGENSOLVERS)


@dataclass(frozen=True, init=False)
class ObservationSettings(_Extended):
    """How, where and when the geometry is observed (``observation.*``, each key in the YAML).

    ``extra`` holds every section a family registered (`register_section`), read as ``settings.<key>``."""

    every_n_epochs: int = 5
    points: Mapping[str, Any] = field(default_factory=lambda: {"preset": "vit", "extra": []})
    gram_dtype: str = "float64"
    batch_size: int | None = None
    num_workers: int | None = None
    nonfinite: str = "warn"
    keep_covariance: str | tuple[int, ...] = "first_last"
    fit_range: tuple[int, int] | None = None
    groups: int = 10
    state_budget_gb: float | None = 8.0
    figures: FigureSettings = field(default_factory=FigureSettings)
    summary: SummarySettings = field(default_factory=SummarySettings)
    early: EarlySettings = field(default_factory=EarlySettings)
    extra: Mapping[str, Any] = field(default_factory=dict)

    _prefix = PREFIX
    _registry = _SECTIONS

    def __post_init__(self) -> None:
        positive_int("every_n_epochs", self.every_n_epochs)
        if not isinstance(self.points, Mapping):
            raise ObservationSettingsError(
                f"{PREFIX}.points: expected a mapping {{preset, extra}}, got {self.points!r}"
            )
        one_of("gram_dtype", self.gram_dtype, list(GRAM_DTYPES))
        _optional_positive_int("batch_size", self.batch_size)
        if self.num_workers is not None and (not is_int(self.num_workers) or self.num_workers < 0):
            raise ObservationSettingsError(
                f"{PREFIX}.num_workers: expected null or an integer >= 0, got {self.num_workers!r}"
            )
        one_of("nonfinite", self.nonfinite, NONFINITE_POLICIES)
        keep = self.keep_covariance
        if isinstance(keep, str):
            one_of("keep_covariance", keep, COVARIANCE_POLICIES)
        elif isinstance(keep, Sequence) and all(is_int(e) and int(e) >= 0 for e in keep):
            object.__setattr__(self, "keep_covariance", tuple(int(e) for e in keep))
        else:
            raise ObservationSettingsError(
                f"{PREFIX}.keep_covariance: expected one of {list(COVARIANCE_POLICIES)} or a list of epochs >= 0, "
                f"got {keep!r}"
            )
        if self.fit_range is not None:
            fit = self.fit_range
            if (
                isinstance(fit, (str, bytes))
                or not isinstance(fit, Sequence)
                or len(fit) != 2
                or not all(is_int(i) for i in fit)
                or not 1 <= fit[0] < fit[1]
            ):
                raise ObservationSettingsError(
                    f"{PREFIX}.fit_range: expected null or [start, stop] with 1 <= start < stop, got {fit!r}"
                )
            object.__setattr__(self, "fit_range", (int(fit[0]), int(fit[1])))
        if not is_int(self.groups) or self.groups < 0 or self.groups == 1:
            raise ObservationSettingsError(
                f"{PREFIX}.groups: expected 0 (no jackknife) or an integer >= 2, got {self.groups!r}"
            )
        budget = self.state_budget_gb
        number = isinstance(budget, (int, float)) and not isinstance(budget, bool)
        if budget is not None and not (number and 0 < budget < math.inf):
            raise ObservationSettingsError(
                f"{PREFIX}.state_budget_gb: expected null (no bound) or a number of GB > 0, got {budget!r}"
            )
        if isinstance(self.figures, Mapping):
            object.__setattr__(self, "figures", FigureSettings(**self.figures))
        elif not isinstance(self.figures, FigureSettings):
            raise ObservationSettingsError(f"{PREFIX}.figures: expected a mapping, got {self.figures!r}")
        sections = dict(self.extra)
        for key, kind in {"summary": SummarySettings, "early": EarlySettings, **_SECTIONS}.items():
            value = sections[key] if key in _SECTIONS else getattr(self, key)
            if isinstance(value, Mapping):
                _reject_unknown(value, f"{PREFIX}.{key}", [f.name for f in fields(kind)])
                value = kind(**value)
            elif not isinstance(value, kind):
                raise ObservationSettingsError(f"{PREFIX}.{key}: expected a mapping, got {value!r}")
            if key in _SECTIONS:
                sections[key] = value
            else:
                object.__setattr__(self, key, value)
        object.__setattr__(self, "extra", sections)

    @classmethod
    def from_config(cls, node: Any) -> ObservationSettings:
        """Builds settings from the ``observation`` node (DictConfig, dict, settings or ``None``), validated."""
        if node is None:
            return cls()
        if isinstance(node, ObservationSettings):
            return node
        values = _plain(node)
        if not isinstance(values, Mapping):
            raise ObservationSettingsError(f"{PREFIX}: expected a mapping of settings, got {values!r}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts) as the YAML spells it: ``from_config(s.to_dict()) == s``."""
        out = asdict(self)
        out.update(out.pop("extra"))
        out["figures"].update(out["figures"].pop("extra"))
        out["points"] = _plain(dict(self.points))
        if isinstance(self.keep_covariance, tuple):
            out["keep_covariance"] = list(self.keep_covariance)
        if self.fit_range is not None:
            out["fit_range"] = list(self.fit_range)
        return out

    def replace(self, **changes: Any) -> ObservationSettings:
        """A copy with some settings changed (validated again)."""
        return ObservationSettings.from_config({**self.to_dict(), **changes})

    @property
    def state_budget_bytes(self) -> int | None:
        """``state_budget_gb`` in bytes (decimal GB), ``None`` for no bound (`tgo.observatory.plan`)."""
        return None if self.state_budget_gb is None else int(self.state_budget_gb * 10**9)

    @property
    def torch_gram_dtype(self) -> torch.dtype:
        """``gram_dtype`` as a torch dtype."""
        return GRAM_DTYPES[self.gram_dtype]

    def keeps_covariance(self, epoch: int, *, first: bool, last: bool) -> bool:
        """Whether the observation of ``epoch`` (``first`` / ``last`` of its run or trajectory) stores covariances."""
        keep = self.keep_covariance
        if isinstance(keep, tuple):
            return int(epoch) in keep
        return keep == "all" or (keep == "first_last" and (first or last))


def register_section(key: str, kind: type) -> type:
    """Adds the settings section ``observation.<key>``, a frozen dataclass that validates itself in ``__post_init__``;
    settings made afterwards have it as ``settings.<key>``."""
    if key in (f.name for f in fields(ObservationSettings)) or _SECTIONS.get(key, kind) is not kind:
        raise ValueError(f"register_section: observation.{key} is already a setting")
    _SECTIONS[key] = kind
    _publish_to_hydra()
    return kind


def register_figure_switch(key: str) -> None:
    """Adds ``observation.figures.<key>`` (true by default): whether a family's own cards are drawn."""
    if key in (f.name for f in fields(FigureSettings)):
        raise ValueError(f"register_figure_switch: observation.figures.{key} is already a setting")
    _FIGURE_SWITCHES[key] = lambda: True
    _publish_to_hydra()


def unregister_extras(section: str | None, switch: str | None) -> None:
    """Removes what `register_section` and `register_figure_switch` added (plug-ins and tests)."""
    _SECTIONS.pop(section or "", None)
    _FIGURE_SWITCHES.pop(switch or "", None)
    _publish_to_hydra()


def _publish_to_hydra() -> None:
    """Publishes the registered sections' defaults as Hydra's ``observation/families``, so that
    ``observation.<family>.<key>=value`` overrides on the command line (no ``+``) though no YAML names the family."""
    defaults = ObservationSettings().to_dict()
    node = {key: defaults[key] for key in _SECTIONS}
    node["figures"] = {key: defaults["figures"][key] for key in _FIGURE_SWITCHES}
    ConfigStore.instance().store(group="observation", name="families", node=node)
