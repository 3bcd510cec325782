"""``ObservationSettings``: every knob of a geometry observation, validated in one place.

The training callback (``tgo.callbacks.spectral_geometry``) and offline observation (``python -m tgo.observe``) read the
same settings from the same config group, ``conf/observation/default.yaml`` (the ``observation`` node of both entry
configs). Adding a setting means: a field here (with its check in ``__post_init__``), a line in that YAML file and a
test; nothing else reads raw config keys.

Errors name the key as a user spells it on the command line (``observation.gram_dtype: expected ...``) and are
raised before any work starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from tgo.errors import UserInputError

__all__ = [
    "ATTENTION_DTYPES",
    "COVARIANCE_POLICIES",
    "EIGENSOLVERS",
    "GRAM_DTYPES",
    "NONFINITE_POLICIES",
    "AttentionSettings",
    "CurvatureSettings",
    "EarlySettings",
    "FigureSettings",
    "NoiseScaleSettings",
    "ObservationSettings",
    "ObservationSettingsError",
    "PhaseSettings",
    "ProbeSettings",
    "SummarySettings",
    "WeightSettings",
]

GRAM_DTYPES: dict[str, torch.dtype] = {"float64": torch.float64, "float32": torch.float32}
NONFINITE_POLICIES: tuple[str, ...] = ("warn", "error")
COVARIANCE_POLICIES: tuple[str, ...] = ("first_last", "all", "none")
ATTENTION_DTYPES: tuple[str, ...] = ("auto", "float64", "float32")
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(key: str, value: Any) -> None:
    if not _is_int(value) or value <= 0:
        raise ObservationSettingsError(f"{PREFIX}.{key}: expected a positive integer, got {value!r}")


def _optional_positive_int(key: str, value: Any) -> None:
    if value is not None:
        _positive_int(key, value)


def _one_of(key: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ObservationSettingsError(f"{PREFIX}.{key}: expected one of {list(allowed)}, got {value!r}")


def _plain(value: Any) -> Any:
    """OmegaConf containers to plain Python (settings are hashable-free plain data)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _reject_unknown(cls: type, given: Mapping[str, Any], prefix: str) -> None:
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ObservationSettingsError(f"{prefix}.{unknown[0]}: unknown setting; expected one of {known}")


@dataclass(frozen=True)
class FigureSettings:
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
        attention: The attention family's cards (block x head heatmaps and depth profiles, ~15 cards, ~2.4 s of
            background rendering per observation of a 12-block network on a CPU core); its scalars are logged either
            way.
        optimisation: The optimisation observatory's cards: depth profiles of the blocks' weight spectra per map
            (``1_depth_profile_weights_<map>/<metric>``, 12 cards) and the network-wide metrics (noise scale,
            curvature) against epoch (``2_vs_epoch/<metric>``); their scalars are logged either way.
        heatmap_max_dim: Largest number of features drawn in a correlation image.
    """

    every_n_observations: int = 1
    story: bool = True
    depth_profiles: bool = True
    bands: bool = True
    spectra: bool = True
    histograms: bool = True
    heatmaps: bool = False
    decay: bool = True
    layer_epoch: bool = True
    attention: bool = True
    optimisation: bool = True
    heatmap_max_dim: int = 384

    def __post_init__(self) -> None:
        _positive_int("figures.every_n_observations", self.every_n_observations)
        _positive_int("figures.heatmap_max_dim", self.heatmap_max_dim)
        for name in (
            "story",
            "depth_profiles",
            "bands",
            "spectra",
            "histograms",
            "heatmaps",
            "decay",
            "layer_epoch",
            "attention",
            "optimisation",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ObservationSettingsError(
                    f"{PREFIX}.figures.{name}: expected true or false, got {getattr(self, name)!r}"
                )


@dataclass(frozen=True)
class ProbeSettings:
    """The hypothesis probes (``docs/hypotheses.md``), measured in the same pass as the spectra.

    Attributes:
        enabled: Record the views ``cls``, ``patch``, ``between_image`` and ``within_image`` of every point, the
            class-conditional geometry and decoding probes, subspace drift and massive activations, and keep the
            per-image vectors at the epochs that keep covariances. ``false`` records the ``all`` view only.
        subspace_k: Leading eigenvectors compared by ``subspace_overlap_prev`` / ``_init`` (the ``_k90`` forms use
            the earlier observation's ``components_90``).
        ridge_alpha: Strength of the ridge probe, in units of the mean per-dimension scatter of the training fold.
        folds: Class-stratified cross-validation folds of the nearest-class-centre and ridge probes (at least 2).
    """

    enabled: bool = True
    subspace_k: int = 10
    ridge_alpha: float = 1.0
    folds: int = 10

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ObservationSettingsError(f"{PREFIX}.probes.enabled: expected true or false, got {self.enabled!r}")
        _positive_int("probes.subspace_k", self.subspace_k)
        alpha = self.ridge_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ObservationSettingsError(f"{PREFIX}.probes.ridge_alpha: expected a number > 0, got {alpha!r}")
        object.__setattr__(self, "ridge_alpha", float(alpha))
        if not _is_int(self.folds) or self.folds < 2:
            raise ObservationSettingsError(f"{PREFIX}.probes.folds: expected an integer >= 2, got {self.folds!r}")


@dataclass(frozen=True)
class AttentionSettings:
    """The attention-geometry family (``tgo.observatory.families.attention``), measured in the same pass.

    Attributes:
        enabled: Recompute every block's attention weights from its ``q`` and ``k`` and record entropy, sink and self
            mass, peak weight, mean attention distance and head diversity per block (view ``attention`` of each
            ``block_NN``; ``docs/observables.md``, "Attention geometry").
        dtype: Precision of the recomputed logits and weights (sums are float64 either way): ``float64`` (exact to
            ~1e-15), ``float32`` (tested within 1e-6 of float64 on every metric, measured <= 4e-8, 1.4e-5 px on the
            distance), or ``auto``: float64 on a GPU, float32 on a CPU, where torch's float64 ``exp`` makes the
            recomputation ~1.7x dearer (``docs/observables.md``, "Precision and cost").
    """

    enabled: bool = True
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ObservationSettingsError(f"{PREFIX}.attention.enabled: expected true or false, got {self.enabled!r}")
        _one_of("attention.dtype", self.dtype, ATTENTION_DTYPES)

    def torch_dtype(self, device: torch.device | str | None) -> torch.dtype:
        """The compute dtype on ``device`` (``auto``: float64 on CUDA and other accelerators, float32 on CPU)."""
        if self.dtype != "auto":
            return GRAM_DTYPES[self.dtype]
        kind = torch.device(device).type if device is not None else "cpu"
        return torch.float32 if kind == "cpu" else torch.float64


@dataclass(frozen=True)
class NoiseScaleSettings:
    """The gradient noise scale (``tgo.observatory.families.noise_scale``), gathered during training.

    Attributes:
        enabled: Record the simple noise scale ``B_simple = tr(Sigma) / |G|^2`` (McCandlish et al. 2018) of the
            training steps since the previous observation, from two batch sizes the training already has (the
            per-rank and the all-reduced gradient under DDP, the micro-batches and their sum with gradient
            accumulation; ``docs/observables.md``, section 10). Training only: offline nothing is
            recorded. With one device and no accumulation there is one batch size: NaN, said once in the log.
        jackknife_blocks: Blocks of consecutive steps of the delete-a-block jackknife standard error (at least 2;
            fewer steps than blocks: one step per block).
        per_block: Also record ``B_simple`` of each block's parameters (view ``gradient`` of every ``block_NN``).
    """

    enabled: bool = True
    jackknife_blocks: int = 10
    per_block: bool = True

    def __post_init__(self) -> None:
        for key in ("enabled", "per_block"):
            value = getattr(self, key)
            if not isinstance(value, bool):
                raise ObservationSettingsError(f"{PREFIX}.noise_scale.{key}: expected true or false, got {value!r}")
        if not _is_int(self.jackknife_blocks) or self.jackknife_blocks < 2:
            raise ObservationSettingsError(
                f"{PREFIX}.noise_scale.jackknife_blocks: expected an integer >= 2, got {self.jackknife_blocks!r}"
            )


@dataclass(frozen=True)
class WeightSettings:
    """The weight-geometry family (``tgo.observatory.families.weights``): every block's linear maps and the patch
    embedding, read from the weights at each observation (no hooks, nothing summed over ranks).

    Attributes:
        enabled: Record the float64 singular values, stable and effective rank, spectral norm and WeightWatcher's
            power-law exponent (with its KS distance) of ``attn.qkv``, ``attn.proj``, ``mlp.fc1``, ``mlp.fc2`` of every
            block and of the patch embedding (views ``weights_<map>``; ``docs/observables.md``, "Weight geometry").
        relative_update: Also record ``||W_t - W_prev||_F / ||W_prev||_F`` against the previous recorded
            observation, which needs its weights: rank 0 keeps the latest two observations' weights in
            ``geometry/weights/`` (about 4 bytes per weight each: 85 MB for ViT-S/16). ``false`` keeps none and
            records NaN.
    """

    enabled: bool = True
    relative_update: bool = True

    def __post_init__(self) -> None:
        for key in ("enabled", "relative_update"):
            value = getattr(self, key)
            if not isinstance(value, bool):
                raise ObservationSettingsError(f"{PREFIX}.weights.{key}: expected true or false, got {value!r}")


@dataclass(frozen=True)
class PhaseSettings:
    """The training-phase family (``tgo.observatory.families.phases``): each observation's change since the previous
    one labelled collapse, compression-seeking, entropy-seeking or unresolved (``tgo.spectral.phases``).

    Attributes:
        enabled: Record ``phase_code``, ``rank_change_z`` and ``alpha_change_z`` on every point's view ``all`` from
            the paired changes of ``effective_rank`` and ``power_law_alpha`` (``docs/observables.md``, "Training
            phases"). Reads the previous observation's records; nothing is hooked or summed.
        z: Normal quantile of a significant change (widened to Student's t for the jackknife's ``G - 1`` degrees of
            freedom), the verdict rule's default 3.
        collapse_drop: Smallest relative loss of effective rank between two observations that is a collapse, in
            ``(0, 1)``.
    """

    enabled: bool = True
    z: float = 3.0
    collapse_drop: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ObservationSettingsError(f"{PREFIX}.phases.enabled: expected true or false, got {self.enabled!r}")
        for key, ok, expected in (
            ("z", lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
            ("collapse_drop", lambda v: 0 < v < 1, "a number in (0, 1)"),
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(float(value)):
                raise ObservationSettingsError(f"{PREFIX}.phases.{key}: expected {expected}, got {value!r}")
            object.__setattr__(self, key, float(value))


@dataclass(frozen=True)
class CurvatureSettings:
    """The curvature family (``tgo.observatory.families.curvature``): the loss Hessian on a fixed batch.

    Attributes:
        enabled: Record the Hessian's top eigenvalues (Lanczos), its trace (Hutchinson, with its standard error) and
            the optimizer's preconditioned sharpness against its edge-of-stability threshold (view ``network``;
            ``docs/observables.md``, "Curvature"). Off by default: each measurement costs
            ``lanczos_iterations * 2 + trace_probes`` Hessian-vector products at most, ~10x a forward each.
        every_n_observations: Measure at every N-th observation (epoch ``e`` counts as ``ceil(e / every_n_epochs)``;
            epoch 0 always; every observation offline).
        images: The curvature batch: the first N images of the analysis subset in a class-stratified, seeded order.
        batch_size: Images per forward of a Hessian-vector product (memory; the result is the same).
        top_k: Top eigenvalues of ``H`` recorded.
        trace_probes: Rademacher probes of the Hutchinson trace (at least 2, for its standard error).
        lanczos_iterations: At most this many Lanczos steps per run.
        lanczos_tol: Stop once every top-k residual ``||H y - theta y||`` is ``<= tol * |theta_1|``.
        seed: Seed of the batch order, the Lanczos start vectors and the probes.
        dtype: Precision of the Hessian-vector products: ``float64``, ``float32`` (~2e-6 relative to float64 on
            vit_small, 2.5x cheaper on a CPU), or ``auto``: float64 on a GPU, float32 on a CPU.
    """

    enabled: bool = False
    every_n_observations: int = 1
    images: int = 64
    batch_size: int = 32
    top_k: int = 5
    trace_probes: int = 16
    lanczos_iterations: int = 30
    lanczos_tol: float = 1e-3
    seed: int = 0
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ObservationSettingsError(f"{PREFIX}.curvature.enabled: expected true or false, got {self.enabled!r}")
        for key in ("every_n_observations", "images", "batch_size", "top_k", "lanczos_iterations"):
            _positive_int(f"curvature.{key}", getattr(self, key))
        if not _is_int(self.trace_probes) or self.trace_probes < 2:
            raise ObservationSettingsError(
                f"{PREFIX}.curvature.trace_probes: expected an integer >= 2, got {self.trace_probes!r}"
            )
        tol = self.lanczos_tol
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < float(tol) < 1:
            raise ObservationSettingsError(f"{PREFIX}.curvature.lanczos_tol: expected a number in (0, 1), got {tol!r}")
        object.__setattr__(self, "lanczos_tol", float(tol))
        if not _is_int(self.seed) or self.seed < 0:
            raise ObservationSettingsError(f"{PREFIX}.curvature.seed: expected an integer >= 0, got {self.seed!r}")
        _one_of("curvature.dtype", self.dtype, ATTENTION_DTYPES)

    def torch_dtype(self, device: torch.device | str | None) -> torch.dtype:
        """The Hessian-vector products' dtype on ``device`` (``auto``: float64 on CUDA and other accelerators, whose
        float64 peak is the float32 one on an H200; float32 on a CPU, where float64 costs 2.5x)."""
        if self.dtype != "auto":
            return GRAM_DTYPES[self.dtype]
        kind = torch.device(device).type if device is not None else "cpu"
        return torch.float32 if kind == "cpu" else torch.float64


@dataclass(frozen=True)
class EarlySettings:
    """The step series: observations at log-spaced optimizer steps early in training (training only).

    A collapse of the representation during warm-up can come and go inside the first epoch, between two epoch
    observations. With ``enabled``, the callback also observes after optimizer step 0 (the initial weights) and after
    the log-spaced steps `steps` gives, up to ``until_step``, into a second record series keyed by the optimizer step
    (``geometry/steps/``, `tgo.records.RunDir.step_series`), with every family but the two that read the training
    between observations (the noise scale, whose window belongs to the epoch series, and curvature). The phases
    compare consecutive step observations, so the report's early-training section labels the warm-up itself.

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
        if not isinstance(self.enabled, bool):
            raise ObservationSettingsError(f"{PREFIX}.early.enabled: expected true or false, got {self.enabled!r}")
        _optional_positive_int("early.until_step", self.until_step)
        _positive_int("early.per_decade", self.per_decade)

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
        for key in ("background", "share"):
            if not isinstance(getattr(self, key), bool):
                raise ObservationSettingsError(
                    f"{PREFIX}.summary.{key}: expected true or false, got {getattr(self, key)!r}"
                )
        _one_of("summary.eigensolver", self.eigensolver, EIGENSOLVERS)


@dataclass(frozen=True)
class ObservationSettings:
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
        probes: The hypothesis probes (`ProbeSettings`).
        attention: The attention-geometry family (`AttentionSettings`).
        noise_scale: The gradient noise scale, gathered during training (`NoiseScaleSettings`).
        summary: Where and when the summary runs (`SummarySettings`).
        phases: The training-phase labels (`PhaseSettings`).
        weights: The weight-geometry family (`WeightSettings`).
        curvature: The loss Hessian's curvature on a fixed batch (`CurvatureSettings`).
        early: The step series, observations at log-spaced steps early in training (`EarlySettings`).
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
    probes: ProbeSettings = field(default_factory=ProbeSettings)
    attention: AttentionSettings = field(default_factory=AttentionSettings)
    noise_scale: NoiseScaleSettings = field(default_factory=NoiseScaleSettings)
    summary: SummarySettings = field(default_factory=SummarySettings)
    phases: PhaseSettings = field(default_factory=PhaseSettings)
    weights: WeightSettings = field(default_factory=WeightSettings)
    curvature: CurvatureSettings = field(default_factory=CurvatureSettings)
    early: EarlySettings = field(default_factory=EarlySettings)

    def __post_init__(self) -> None:
        _positive_int("every_n_epochs", self.every_n_epochs)
        if not isinstance(self.points, Mapping):
            raise ObservationSettingsError(
                f"{PREFIX}.points: expected a mapping {{preset, extra}}, got {self.points!r}"
            )
        _one_of("gram_dtype", self.gram_dtype, list(GRAM_DTYPES))
        _optional_positive_int("batch_size", self.batch_size)
        if self.num_workers is not None and (not _is_int(self.num_workers) or self.num_workers < 0):
            raise ObservationSettingsError(
                f"{PREFIX}.num_workers: expected null or an integer >= 0, got {self.num_workers!r}"
            )
        _one_of("nonfinite", self.nonfinite, NONFINITE_POLICIES)
        keep = self.keep_covariance
        if isinstance(keep, str):
            _one_of("keep_covariance", keep, COVARIANCE_POLICIES)
        elif isinstance(keep, Sequence) and all(_is_int(e) and int(e) >= 0 for e in keep):
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
                or not all(_is_int(i) for i in fit)
                or not 1 <= fit[0] < fit[1]
            ):
                raise ObservationSettingsError(
                    f"{PREFIX}.fit_range: expected null or [start, stop] with 1 <= start < stop, got {fit!r}"
                )
            object.__setattr__(self, "fit_range", (int(fit[0]), int(fit[1])))
        if not _is_int(self.groups) or self.groups < 0 or self.groups == 1:
            raise ObservationSettingsError(
                f"{PREFIX}.groups: expected 0 (no jackknife) or an integer >= 2, got {self.groups!r}"
            )
        if isinstance(self.figures, Mapping):
            object.__setattr__(self, "figures", _figures_from(self.figures))
        elif not isinstance(self.figures, FigureSettings):
            raise ObservationSettingsError(f"{PREFIX}.figures: expected a mapping, got {self.figures!r}")
        for key, kind in _SECTIONS.items():
            value = getattr(self, key)
            if isinstance(value, Mapping):
                _reject_unknown(kind, value, f"{PREFIX}.{key}")
                object.__setattr__(self, key, kind(**value))
            elif not isinstance(value, kind):
                raise ObservationSettingsError(f"{PREFIX}.{key}: expected a mapping, got {value!r}")

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
        _reject_unknown(cls, values, PREFIX)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts) as the YAML spells it: ``from_config(s.to_dict()) == s``."""
        out = asdict(self)
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


_SECTIONS: dict[str, type] = {
    "probes": ProbeSettings,
    "attention": AttentionSettings,
    "noise_scale": NoiseScaleSettings,
    "summary": SummarySettings,
    "phases": PhaseSettings,
    "weights": WeightSettings,
    "curvature": CurvatureSettings,
    "early": EarlySettings,
}
"""The nested settings sections (besides ``figures``) and their classes: a mapping is validated into its class."""


def _figures_from(values: Mapping[str, Any]) -> FigureSettings:
    _reject_unknown(FigureSettings, values, f"{PREFIX}.figures")
    return FigureSettings(**values)
