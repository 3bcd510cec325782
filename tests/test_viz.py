"""Figures draw what the numbers say: log axes span the spectrum, not its round-off."""

from __future__ import annotations

import numpy as np

from tgo import viz


def test_round_off_below_the_numerical_floor_is_not_drawn_on_log_axes():
    rank_two = np.array([4.0, 1.0, 3e-17, -2e-17, 1e-18, np.nan])  # a rank-2 covariance's eigenvalues as eigh returns
    fig = viz.spectrum_history_figure([(0, rank_two)], title="pos_embed")
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [1, 2] and list(line.get_ydata()) == [4.0, 1.0]
    low, _ = fig.axes[0].get_ylim()
    assert low > 1e-3  # the axis ends near the smallest real eigenvalue, not at 1e-17


def test_decay_curves_start_at_one_and_keep_every_real_eigenvalue():
    spectrum = np.array([2.0, 1.0, 0.5, 0.25, 1e-9])  # 1e-9 of the top is small but far above round-off
    fig = viz.decay_curves_figure({"block_01": spectrum}, title="epoch 3")
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_allclose(line.get_ydata(), np.log10(spectrum / 2.0))
