"""``ObservationSettings``: every knob of a geometry observation, validated in one place.

The training callback (``tgo.callbacks.spectral_geometry``) and offline observation (``python -m tgo.observe``) read the
same settings from the same config group, ``conf/observation/default.yaml`` (the ``observation`` node of both entry
configs). Adding a core setting means a field here, a line in that YAML file and a test. A measurement family's
section (``observation.<section>.<key>``) is a frozen dataclass checked in ``__post_init__``, declared in the family's
own file and registered with `register_section` when the family is; its defaults reach Hydra from the dataclass
(`_publish_to_hydra`), so no YAML file names a family. Nothing else reads raw config keys.

Errors name the key as a user spells it on the command line (``observation.gram_dtype: expected ...``) and are
raised before any work starts.
"""

from __future__ import annotations

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
COMPUTE_DTYPES: tuple[str, ...] = ("auto", "float64", "float32")
"""A family's compute precision (`compute_dtype`): ``auto`` is float64 on an accelerator, float32 on a CPU."""
PREFIX = "observation"


class ObservationSettingsError(UserInputError):
    """An observation setting is unknown or out of range; the message names ``observation.<key>``."""


def check_jackknife_groups(groups: int, images: int) -> None:
    """Refuses (one line) more jackknife groups than analysis images, before any image is observed.

    Images are dealt to the ``G`` groups in turn over the class-sorted subset (`tgo.spectral.jackknife_groups`), so
    every group holds an image exactly when ``G <= images``; with more, ``G - images`` groups would be empty and their
    leave-one-group-out spectra copies of the full one, a standard error computed from nothing. A group may lack a
    class when a class has fewer than ``G`` images; that only makes its class mix approximate.

    Raises:
        ObservationSettingsError: ``groups > images`` (``groups`` 0, no jackknife, is always accepted).
    """
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
    """A `COMPUTE_DTYPES` setting as a torch dtype on ``device``: ``auto`` is float64 on CUDA and other
    accelerators (whose float64 peak the families' measured costs allow), float32 on a CPU (where torch's float64
    costs 1.7-2.5x; each family documents its measured error)."""
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


_FIGURE_SWITCHES: dict[str, Callable[[], Any]] = {}
"""``observation.figures.<key>`` switches the families registered (`register_figure_switch`)."""
_SECTIONS: dict[str, type] = {}
"""``observation.<key>`` sections the families registered (`register_section`), in registration order."""


@dataclass(frozen=True, init=False)
class FigureSettings(_Extended):
    """Which TensorBoard figures the callback draws, and how often (scalars are never thinned).

    Every figure is an image card rendered on a background thread at each figure observation
    (``tgo.callbacks.dashboard.figure_job``); the switches below exist because each costs rendering time.

    Attributes:
        every_n_observations: Draw figures at every N-th observation (and always at the last epoch).
        story: The story card (``0_story/story``, TensorBoard's first card) when the callback has a story function.
        depth_profiles: Depth profiles (one line per observed epoch, +-1 jackknife s.e.) of the main observables
            and the probe metrics on their views (``1_depth_profile[_<view>]/<metric>``, ~10 cards, ~0.1-0.2 s each).
        bands: The main observables against epoch, one line per point, +-1 s.e. (``2_vs_epoch/<metric>``, 4 cards).
        spectra: One card per point of its eigenvalue spectra over epochs.
        histograms: log10-eigenvalue histograms per point.
        heatmaps: Correlation matrices as exact per-pixel images, at the epochs that keep covariances (off by
            default: 15 cards of 96-384 px squares that say less than the ``mean_abs_offdiag_correlation`` depth
            profile, which the report complements with |r| histograms).
        decay: Spectral decay curves of every point at this observation.
        layer_epoch: Layer x epoch heatmaps of the charted observables.
        optimisation: The optimisation observatory's cards: depth profiles of the blocks' weight spectra per map
            (``1_depth_profile_weights_<map>/<metric>``, 12 cards) and the network-wide metrics (noise scale,
            curvature) against epoch (``2_vs_epoch/<metric>``); their scalars are logged either way.
        heatmap_max_dim: Largest number of features drawn in a correlation image.
        extra: A family's own cards' switch (`register_figure_switch`, ``figures.<family>``), true by default.
    """

    _prefix = f"{PREFIX}.figures"
    _registry = _FIGURE_SWITCHES

    every_n_observations: int = 1
    story: bool = True
    depth_profiles: bool = True
    bands: bool = True
    spectra: bool = True
    histograms: bool = True
    heatmaps: bool = False
    decay: bool = True
    layer_epoch: bool = True
    optimisation: bool = True
    heatmap_max_dim: int = 384
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        positive_int("figures.every_n_observations", self.every_n_observations)
        positive_int("figures.heatmap_max_dim", self.heatmap_max_dim)
        check_flags("figures", self, *(f.name for f in fields(self) if f.type == "bool"), *self.extra)


@dataclass(frozen=True)
class EarlySettings:
    """The step series: observations at log-spaced optimizer steps early in training (training only).

    A collapse of the representation during warm-up can come and go inside the first epoch, between two epoch
    observations. With ``enabled``, the callback also observes after optimizer step 0 and the log-spaced steps
    `steps` gives into a second record series keyed by the optimizer step (`tgo.records.RunDir.step_series`), with
    the families whose ``series`` has ``step`` (docs/usage.md, "Early training, denser").

    Attributes:
        enabled: Observe the step series.
        until_step: The last optimizer step that may be observed; ``None``: the optimizer steps of the first epoch.
        per_decade: Observations per decade of steps: step ``round(10 ** (k / per_decade))`` for ``k = 0, 1, ...``
            (4: steps 1, 2, 3, 6, 10, 18, 32, 56, 100, ...).
    """

    enabled: bool = False
    until_step: int | None = None
    per_decade: int = 4

    def __post_init__(self) -> None:
        check_flags("early", self, "enabled")
        _optional_positive_int("early.until_step", self.until_step)
        positive_int("early.per_decade", self.per_decade)

    def steps(self, until_step: int) -> tuple[int, ...]:
        """The observed steps: 0 and every distinct ``round(10 ** (k / per_decade))`` in ``1 .. until_step``
        (``self.until_step`` when set, else the given one: the first epoch's optimizer steps)."""
        last = int(self.until_step if self.until_step is not None else until_step)
        found = [0]
        k = 0
        while (step := round(10 ** (k / self.per_decade))) <= last:
            if step != found[-1]:
                found.append(step)
            k += 1
        return tuple(found)


EIGENSOLVERS = ("auto", "cpu", "gpu")
"""Where the summary's float64 eigendecompositions run (`SummarySettings.eigensolver`)."""


@dataclass(frozen=True)
class SummarySettings:
    """Where and when the summary of a reduced observation (eigendecompositions, observables, records) runs.

    Attributes:
        background: Training waits only for the stream and the reduction; the summary, the records and the scalars
            complete on a background thread (at most one observation in flight, then training waits), flushed before
            ``fit`` returns or re-raises. ``false``: the observation completes before training resumes.
        share: With several ranks, every rank summarises its share of the points (each rank holds the same reduced
            state) and rank 0 gathers the results in one collective; records are bitwise those of one process
            (with the ``cpu`` eigensolver: ``auto`` on CUDA may choose differently on two ranks, each to 1e-9 of
            LAPACK). ``false``: rank 0 summarises every point.
        eigensolver: ``cpu`` (numpy/LAPACK float64 ``eigvalsh``), ``gpu`` (torch float64 ``eigvalsh`` on the
            observation's CUDA device), or ``auto``: the faster of the two for each matrix shape, timed once per
            process where a CUDA device is present, else ``cpu``.
    """

    background: bool = True
    share: bool = True
    eigensolver: str = "auto"

    def __post_init__(self) -> None:
        check_flags("summary", self, "background", "share")
        one_of("summary.eigensolver", self.eigensolver, EIGENSOLVERS)


@dataclass(frozen=True, init=False)
class ObservationSettings(_Extended):
    """How, where and when the geometry is observed.

    Attributes:
        every_n_epochs: Observe after every N completed epochs (epoch 0 and the final epoch always). Training only.
        points: ``{"preset": "vit" | None, "extra": [{name, module, read, tokens}, ...]}``; see
            ``tgo.observatory.points.points_from_config``.
        gram_dtype: ``float64`` (exact to ~1e-15) or ``float32`` (~5e-8, faster on GPUs).
        batch_size: Images per observation forward pass (``None``: the DataModule's analysis batch size).
        num_workers: DataLoader workers of the observation pass (``None``: the DataModule's).
        nonfinite: ``warn`` records NaN observables for a point with NaN/Inf activations and continues; ``error``
            stops.
        keep_covariance: Which observations store full covariance matrices in the spectra records: ``first_last``
            (the first and the last observation: epoch 0 and the final epoch in training, the first and last model
            of an offline trajectory), ``all``, ``none``, or a list of epochs.
        fit_range: ``(start, stop)``, 1-based inclusive eigenvalue indices of the power-law fit (``None``: default
            ``1 .. D // 2``).
        groups: Jackknife groups ``G``: the analysis images are split into ``G`` class-stratified groups, each row
            is accumulated in its image's group, and every observable gets a delete-a-group jackknife standard
            error from the ``G`` leave-one-group-out spectra (``tgo.spectral.jackknife``). ``0`` disables it (one
            accumulator per point, standard errors NaN); otherwise at least 2.
        figures: TensorBoard figure settings (`FigureSettings`).
        summary: Where and when the summary runs (`SummarySettings`).
        early: The step series, observations at log-spaced steps early in training (`EarlySettings`).
        extra: ``{key: settings}`` of every section a measurement family registered (`register_section`), each
            read as ``settings.<key>`` (``observation.<key>`` in the YAML; keyword arguments and ``from_config``
            take them by that key, as mappings or instances).
    """

    every_n_epochs: int = 5
    points: Mapping[str, Any] = field(default_factory=lambda: {"preset": "vit", "extra": []})
    gram_dtype: str = "float64"
    batch_size: int | None = None
    num_workers: int | None = None
    nonfinite: str = "warn"
    keep_covariance: str | tuple[int, ...] = "first_last"
    fit_range: tuple[int, int] | None = None
    groups: int = 10
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
        """Builds settings from the ``observation`` config node (DictConfig, dict, existing settings or ``None``).

        Raises:
            ObservationSettingsError: an unknown key or a value out of range, naming ``observation.<key>``.
        """
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
    def torch_gram_dtype(self) -> torch.dtype:
        """``gram_dtype`` as a torch dtype."""
        return GRAM_DTYPES[self.gram_dtype]

    def keeps_covariance(self, epoch: int, *, first: bool, last: bool) -> bool:
        """Whether the observation of ``epoch`` stores full covariances.

        Args:
            epoch: The observation's epoch label.
            first: It is the first observation (epoch 0 in training; the first model offline).
            last: It is the last observation (the final epoch in training; the last model offline).
        """
        keep = self.keep_covariance
        if isinstance(keep, tuple):
            return int(epoch) in keep
        return keep == "all" or (keep == "first_last" and (first or last))


def register_section(key: str, kind: type) -> type:
    """Adds the settings section ``observation.<key>``: a frozen dataclass whose defaults are the section's and whose
    ``__post_init__`` refuses a bad value naming ``observation.<key>.<field>`` (a measurement family's, registered
    with the family). Settings made afterwards have it, as ``settings.<key>``.

    Raises:
        ValueError: the key is a core setting or taken by another class.
    """
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
    """Stores the registered sections' defaults as Hydra's ``observation/families`` config, which
    ``conf/observation/default.yaml`` composes first: ``observation.<family>.<key>=value`` then overrides a family's
    setting on the command line (no ``+``) although no YAML file names the family, and ``--cfg job`` shows it."""
    defaults = ObservationSettings().to_dict()
    node = {key: defaults[key] for key in _SECTIONS}
    node["figures"] = {key: defaults["figures"][key] for key in _FIGURE_SWITCHES}
    ConfigStore.instance().store(group="observation", name="families", node=node)
