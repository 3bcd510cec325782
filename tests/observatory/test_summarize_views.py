"""`summarize_views`: many views in one stack equal one `summarize_view` per view, bit for bit, whatever the chunks.

The summary hands chunks of views to its pool (`view_chunks`); a chunk may hold views of several sizes, views whose
spectra the eigenvalue stack cannot take (zero variance) and covariances whose kept variances differ (a constant
feature), so each of those paths is checked against the one-view call.
"""

from __future__ import annotations

import numpy as np
import pytest

from tgo.observatory.results import summarize_view, summarize_views, view_chunks
from tgo.observatory.views import ViewMoments
from tgo.spectral.jackknife import leave_one_group_out, row_moments


def _view(
    rng: np.random.Generator, dim: int, rows: int = 60, groups: int = 5, constant: int | None = None
) -> ViewMoments:
    x = rng.normal(size=(rows, dim)) * rng.uniform(0.2, 3.0, size=dim)
    if constant is not None:
        x[:, constant] = 1.5  # a feature without variance: excluded from the correlations
    total = row_moments(x)
    parts = [row_moments(x[g::groups]) for g in range(groups)]
    return ViewMoments(total, leave_one_group_out(total, parts))


def _zero_view(dim: int, groups: int = 5) -> ViewMoments:
    x = np.ones((40, dim))
    total = row_moments(x)
    return ViewMoments(total, leave_one_group_out(total, [row_moments(x[g::groups]) for g in range(groups)]))


def _bits(result: object) -> list[bytes]:
    r = result
    out = [np.asarray(r.spectrum.eigenvalues).tobytes()]  # type: ignore[attr-defined]
    for table in (r.observables, r.stderr):  # type: ignore[attr-defined]
        out += [k.encode() + np.float64(v).tobytes() for k, v in table.items()]
    out += [k.encode() + np.asarray(v).tobytes() for k, v in r.jackknife.items()]  # type: ignore[attr-defined]
    return out


def test_many_views_in_one_stack_equal_one_call_per_view() -> None:
    rng = np.random.default_rng(7)
    views = [_view(rng, 12), _view(rng, 12, constant=3), _zero_view(12), _view(rng, 7), _view(rng, 12, constant=0)]
    flags = [False, False, False, True, False]
    together = summarize_views(views, nonfinite=flags)
    for vm, flag, result in zip(views, flags, together, strict=True):
        assert _bits(result) == _bits(summarize_view(vm, nonfinite=flag))
    assert np.isnan(together[3].observables["effective_rank"])  # a non-finite point's view: NaN geometry
    assert np.isnan(together[2].observables["effective_rank"])  # zero variance: undefined


def test_summarize_views_refuses_flags_of_another_length() -> None:
    with pytest.raises(ValueError, match="2 views but 1 nonfinite flags"):
        summarize_views([_zero_view(3), _zero_view(3)], nonfinite=[False])


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_view_chunks_cover_every_view_once_in_order_one_size_each(workers: int) -> None:
    sizes = [(96, 11)] * 30 + [(384, 11)] * 5 + [(96, 11)] * 4
    chunks = view_chunks(sizes, workers)
    assert [i for chunk in chunks for i in chunk] == list(range(len(sizes)))
    assert all(len({sizes[i][0] for i in chunk}) == 1 for chunk in chunks)
    assert len(chunks) >= min(2 * workers, len(sizes))
    big = [chunk for chunk in chunks if sizes[chunk[0]][0] == 384]
    assert all(len(chunk) == 1 for chunk in big)  # 13 MB a view: over the per-chunk budget together


def test_view_chunks_of_small_views_stay_few() -> None:
    chunks = view_chunks([(96, 11)] * 69, workers=2)
    assert 4 <= len(chunks) <= 5  # ~2 x workers chunks, not one task per view
