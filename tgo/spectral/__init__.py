"""Spectral engine: exact streaming covariance, float64 eigendecomposition and the TGO-I observables.

Pure numerics (torch + numpy, no Lightning). The flow for one observation point::

    acc = StreamingCovariance(dim)                  # per point, per rank
    acc.update(activations)                         # every batch, never stored
    allreduce_accumulators(accs, all_reduce_sum)    # every rank, two sum collectives
    cov = acc.covariance()                          # rank 0
    spectrum = eigendecompose(cov, acc.n, acc.n_nonfinite)
    row = summarize(cov, spectrum)                  # {name: float}, one per CATALOGUE entry

Attention geometry (`AttentionAccumulator`) follows the same pattern; formulas: ``docs/observables.md``.
"""

from tgo.spectral.accumulator import StreamingCovariance, allreduce_accumulators, strict_fp32_math
from tgo.spectral.attention import ATTENTION_METRICS, AttentionAccumulator, AttentionSummary
from tgo.spectral.catalogue import CATALOGUE, Catalogue, Observable, SpectralInputs
from tgo.spectral.decomposition import Spectrum, eigendecompose
from tgo.spectral.eigensolver import Eigvalsh, cpu_eigvalsh, resolve_eigvalsh
from tgo.spectral.jackknife import (
    GroupedCovariance,
    jackknife_groups,
    jackknife_stderr,
    leave_one_group_out,
)
from tgo.spectral.observables import (
    FLATNESS_FLOOR,
    components_for_variance,
    cumulative_explained_variance,
    decay_curve,
    default_fit_range,
    effective_rank,
    mean_abs_offdiag_correlation,
    offdiag_energy_fraction,
    participation_ratio,
    power_law_fit,
    singular_values,
    spectral_anisotropy,
    spectral_entropy,
    spectral_flatness,
    stable_rank,
    total_correlation,
)
from tgo.spectral.summary import summarize

__all__ = [
    "ATTENTION_METRICS",
    "CATALOGUE",
    "FLATNESS_FLOOR",
    "AttentionAccumulator",
    "AttentionSummary",
    "Catalogue",
    "Eigvalsh",
    "GroupedCovariance",
    "Observable",
    "SpectralInputs",
    "Spectrum",
    "StreamingCovariance",
    "allreduce_accumulators",
    "components_for_variance",
    "cpu_eigvalsh",
    "cumulative_explained_variance",
    "decay_curve",
    "default_fit_range",
    "effective_rank",
    "eigendecompose",
    "jackknife_groups",
    "jackknife_stderr",
    "leave_one_group_out",
    "mean_abs_offdiag_correlation",
    "offdiag_energy_fraction",
    "participation_ratio",
    "power_law_fit",
    "resolve_eigvalsh",
    "singular_values",
    "spectral_anisotropy",
    "spectral_entropy",
    "spectral_flatness",
    "stable_rank",
    "strict_fp32_math",
    "summarize",
    "total_correlation",
]
