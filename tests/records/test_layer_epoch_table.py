"""`tgo.records.layer_epoch_table`: the one layer x epoch table behind TensorBoard's and the report's figures."""

from __future__ import annotations

import numpy as np

from tgo.records import layer_epoch_table


def test_rows_are_points_columns_epochs_and_gaps_are_nan():
    series = {
        "block_01": (np.array([0, 1, 2]), np.array([1.0, 2.0, 3.0])),
        "cls": (np.array([0, 2]), np.array([10.0, 30.0])),
    }
    table = layer_epoch_table(series, ["block_01", "cls", "unrecorded"], [0, 1, 2])
    assert table.shape == (3, 3) and table.dtype == np.float64
    np.testing.assert_array_equal(table[0], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(table[1], [10.0, np.nan, 30.0])
    assert np.isnan(table[2]).all(), "a point without a series is a row of NaN"


def test_epochs_not_asked_for_are_left_out():
    """A figure drawn at epoch 1 shows no later epoch, even when the records already hold one."""
    series = {"block_01": (np.array([0, 1, 5]), np.array([1.0, 2.0, 6.0]))}
    np.testing.assert_array_equal(layer_epoch_table(series, ["block_01"], [0, 1]), [[1.0, 2.0]])
    assert layer_epoch_table({}, ["block_01"], []).shape == (1, 0)
