"""What the callback logs to loggers other than TensorBoard: a small table a person can read, keyed right.

TensorBoard shows every logged observable as one chart per tag with one line per point (its per-point runs,
`callbacks.tensorboard_runs`). A CSV, W&B or MLflow logger has no such layout: every ``<observable>/<point>`` would be
one column (1,356 for a 4-block model), and Lightning's ``step`` column would hold the epoch on geometry rows beside
the optimizer step on training rows. So those loggers get the headline observables of the default view per point,
with the observation's epoch as a value (`EPOCH_KEY`) and its true optimizer step as the step; the full records are
``geometry/metrics.csv`` (``tgo.load_series``). The choice is stated in docs/usage.md ("Loggers").
"""

from __future__ import annotations

from tgo.observatory.results import Results
from tgo.records import DEFAULT_VIEW

__all__ = ["EPOCH_KEY", "HEADLINE_METRICS", "headline_scalars", "observation_keys"]

HEADLINE_METRICS: tuple[str, ...] = ("effective_rank", "power_law_alpha")
"""The observables of the default view every non-TensorBoard logger gets per point: the paper's two measures of how
the representation spreads (the report's phase map reads the same two)."""

EPOCH_KEY = "geometry/epoch"
"""The logged value that names an epoch observation (epoch k = after k completed epochs). Not Lightning's own
``epoch`` column, which on training rows is the 0-based epoch in progress."""


def headline_scalars(results: Results, *, prefix: str = "") -> dict[str, float]:
    """``{<prefix>geometry/<metric>/<point>: value}`` of `HEADLINE_METRICS` on the default view, in point order then
    metric order (NaN kept: a point that could not be measured says so); metrics a point lacks are left out."""
    out: dict[str, float] = {}
    for point, result in results.by_point(DEFAULT_VIEW).items():
        for metric in HEADLINE_METRICS:
            if metric in result.observables:
                out[f"{prefix}geometry/{metric}/{point}"] = float(result.observables[metric])
    return out


def observation_keys(series: str, key: int) -> dict[str, float]:
    """The keys that place an observation's row: `EPOCH_KEY` for the epoch series (the step series' key is the
    optimizer step, which is already the row's step)."""
    return {EPOCH_KEY: int(key)} if series == "epoch" else {}
