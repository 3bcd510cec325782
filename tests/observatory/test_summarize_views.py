"""`summarize_views`: many views in one stack equal one `summarize_view` per view, bit for bit, whatever the chunks.

The summary hands chunks of views to its pool (`view_chunks`); a chunk may hold views of several sizes, views whose
spectra the eigenvalue stack cannot take (zero variance) and covariances whose kept variances differ (a constant
feature), so each of those paths is checked against the one-view call.
"""

from __future__ import annotations

import numpy as np
import pytest

from tgo.observatory.results import summarize_view, summarize_views, view_chunks
from tgo.observatory.views import ViewMoments, ViewRows
from tgo.spectral.jackknife import leave_one_group_out, row_moments, subset_masks


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


@pytest.mark.parametrize("ddof", [1, 0])
def test_a_view_of_fewer_images_than_features_is_summarized_from_its_rows_as_from_its_covariances(ddof: int) -> None:
    """The CLS and between-image views of a small analysis subset take their spectra from ``[n, n]`` products
    (`ViewRows`): every observable, standard error and replicate equals the ``[D, D]`` route to round-off."""
    rng = np.random.default_rng(11)
    n, dim, groups = 40, 64, 5
    x = 2.0 + rng.normal(size=(n, dim)) * np.linspace(3.0, 0.05, dim)
    image_groups = np.arange(n) % groups
    total = row_moments(x)
    parts = [row_moments(x[image_groups == g]) for g in range(groups)]
    if ddof == 0:  # the between-image view: population covariances, n_rows = images
        total = (total[0] * (n - 1) / n, *total[1:])
        leave_out = [(c * (m - 1) / m, mean, m, bad) for c, mean, m, bad in leave_one_group_out(row_moments(x), parts)]
    else:
        leave_out = leave_one_group_out(total, parts)
    by_covariance = ViewMoments(total, leave_out)
    by_rows = ViewMoments(total, leave_out, rows=ViewRows(x, subset_masks(image_groups, groups, n), ddof))
    want, got = summarize_view(by_covariance), summarize_view(by_rows)
    top = want.spectrum.eigenvalues[0]
    np.testing.assert_allclose(got.spectrum.eigenvalues, want.spectrum.eigenvalues, rtol=0, atol=1e-12 * top)
    assert np.all(got.spectrum.eigenvalues[n - 1 :] == 0.0)
    compared = 0
    for table in ("observables", "stderr"):
        for name, value in getattr(want, table).items():
            if name in ("n_clamped", "most_negative_eigenvalue"):  # round-off bookkeeping: the routes' own
                continue
            np.testing.assert_allclose(getattr(got, table)[name], value, rtol=1e-10, atol=1e-12, err_msg=name)
            compared += np.isfinite(value)
    for name, replicates in want.jackknife.items():
        np.testing.assert_allclose(got.jackknife[name], replicates, rtol=1e-10, atol=1e-12, err_msg=name)
    assert compared > 40
    # a view with more rows than features keeps the [D, D] route: the same bits with or without its rows
    narrow = x[:, :30]
    narrow_total = row_moments(narrow)
    narrow_out = leave_one_group_out(narrow_total, [row_moments(narrow[image_groups == g]) for g in range(groups)])
    with_rows = ViewRows(narrow, subset_masks(image_groups, groups, n), 1)
    assert _bits(summarize_view(ViewMoments(narrow_total, narrow_out, rows=with_rows))) == _bits(
        summarize_view(ViewMoments(narrow_total, narrow_out))
    )
