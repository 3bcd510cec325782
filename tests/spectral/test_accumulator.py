"""StreamingCovariance: exact under any batching and merge order, honest about bad rows, restorable, strict math."""

from __future__ import annotations

import io
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.spectral.spectral_data import (
    METRIC_KEYS,
    accumulate,
    make_rows,
    packed,
    power_law_spectrum,
    reference_covariance,
    relative_errors,
)
from tgo.spectral import StreamingCovariance, eigendecompose, strict_fp32_math, summarize

DIM = 24
ROWS = make_rows(600, power_law_spectrum(DIM), massive=3, seed=11)
BASELINE = accumulate(ROWS, batch_rows=600)


def _summary(acc: StreamingCovariance) -> dict[str, float]:
    cov = acc.covariance()
    return summarize(cov, eigendecompose(cov, acc.n, acc.n_nonfinite))


def _assert_same_state(a: StreamingCovariance, b: StreamingCovariance, rtol: float = 1e-12) -> None:
    """Same rows, same covariance (relative to its scale), same observables."""
    assert (a.n, a.n_nonfinite) == (b.n, b.n_nonfinite)
    ca, cb = a.covariance().numpy(), b.covariance().numpy()
    assert np.abs(ca - cb).max() <= rtol * np.abs(cb).max()
    np.testing.assert_allclose(a.mean().numpy(), b.mean().numpy(), rtol=rtol, atol=0)
    errors = relative_errors(_summary(a), _summary(b))
    assert max(errors.values()) <= rtol, {k: v for k, v in errors.items() if v > rtol}


# ---------------------------------------------------------------------------------------------------- basics
def test_matches_two_pass_covariance_and_mean():
    np.testing.assert_allclose(
        BASELINE.covariance().numpy(),
        reference_covariance(ROWS),
        rtol=0,
        atol=1e-14 * np.abs(reference_covariance(ROWS)).max(),
    )
    np.testing.assert_allclose(BASELINE.mean().numpy(), ROWS.astype(np.float64).mean(0), rtol=1e-15)
    assert BASELINE.n == 600 and BASELINE.n_nonfinite == 0


def test_any_leading_shape_is_rows():
    acc = StreamingCovariance(DIM)
    acc.update(torch.from_numpy(ROWS).reshape(10, 6, 10, DIM))  # [B, heads, tokens, D] -> 600 rows
    _assert_same_state(acc, BASELINE)


def test_state_is_float64_and_constant_size():
    acc = accumulate(ROWS, batch_rows=7)
    assert acc.shift.dtype == acc._s1.dtype == acc._s2.dtype == torch.float64
    assert packed(acc).numel() == 2 + DIM + DIM * DIM == acc.packed_size


def test_covariance_is_exactly_symmetric():
    cov = accumulate(ROWS, gram_dtype=torch.float32, batch_rows=33).covariance()
    assert torch.equal(cov, cov.T)


def test_accepts_low_precision_inputs_and_upcasts_exactly():
    """bf16 activations are widened before anything else (the shift subtraction happens in float64)."""
    x = torch.from_numpy(ROWS).to(torch.bfloat16)
    acc = StreamingCovariance(DIM)
    acc.update(x)
    want = reference_covariance(x.to(torch.float64).numpy())
    assert np.abs(acc.covariance().numpy() - want).max() <= 1e-13 * np.abs(want).max()


@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.int32])
def test_float64_gram_of_narrower_rows_is_that_of_their_exact_widening(source: torch.dtype):
    """The float64 Gram centres narrower rows in float64 (widened first, then the shift subtracted in place): bit for
    bit the sums of the same rows handed over already widened (a float64 batch takes the same-dtype subtraction)."""
    x = torch.from_numpy(ROWS * (100 if source == torch.int32 else 1)).to(source)
    narrow, wide = StreamingCovariance(DIM), StreamingCovariance(DIM)
    for part in torch.split(x, 150):
        narrow.update(part)
        wide.update(part.to(torch.float64))
    assert torch.equal(narrow.shift, wide.shift)
    assert torch.equal(narrow._s1, wide._s1) and torch.equal(narrow._s2, wide._s2)
    assert narrow.n == wide.n == x.shape[0]


@pytest.mark.parametrize("dim", [64, 97, 130])
@pytest.mark.parametrize("gram_dtype", [torch.float64, torch.float32])
def test_wide_rows_take_the_strip_gram_and_match_the_two_pass_covariance(dim: int, gram_dtype: torch.dtype):
    """From 64 features on, the Gram is built from column strips on and above the diagonal and the blocks below are
    copied (widths not divisible by the four strips included): the sums of several batches equal numpy's product of
    the centred rows, the state is symmetric, and the covariance is the two-pass one (float32 Gram: to its bound)."""
    rows = make_rows(700, power_law_spectrum(dim), massive=3, seed=dim)
    acc = accumulate(rows, gram_dtype=gram_dtype, batch_rows=[300, 1, 399])
    centred = rows.astype(np.float64) - acc.shift.numpy()
    gram = acc._s2.numpy()
    tol = 1e-13 if gram_dtype == torch.float64 else 1e-6
    assert np.abs(gram - centred.T @ centred).max() <= tol * np.abs(gram).max()
    lower = np.tril_indices(dim, -1)
    assert np.abs(gram[lower] - gram.T[lower]).max() <= 1e-15 * np.abs(gram).max()
    want = reference_covariance(rows)
    assert np.abs(acc.covariance().numpy() - want).max() <= tol * np.abs(want).max()


# ---------------------------------------------------------------------------------------------- batching and merging
@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=599), max_size=12, unique=True))
def test_any_batch_split_gives_the_same_result(cuts: list[int]):
    edges = [0, *sorted(cuts), 600]
    _assert_same_state(accumulate(ROWS, batch_rows=np.diff(edges).tolist()), BASELINE)


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=1, max_value=599), min_size=1, max_size=8, unique=True),
    data=st.data(),
)
def test_any_merge_order_gives_the_same_result(cuts: list[int], data: st.DataObject):
    edges = [0, *sorted(cuts), 600]
    parts = []
    for lo, hi in itertools.pairwise(edges):
        acc = StreamingCovariance(DIM)
        acc.update(torch.from_numpy(ROWS[lo:hi]))
        parts.append(acc)
    # merge in a random order, as a random binary tree
    order = data.draw(st.permutations(range(len(parts))))
    pool = [parts[i] for i in order]
    while len(pool) > 1:
        i = data.draw(st.integers(min_value=0, max_value=len(pool) - 2))
        merged = pool.pop(i).merge(pool.pop(i))
        pool.insert(i, merged)
    _assert_same_state(pool[0], BASELINE)


def test_merge_leaves_other_untouched_and_handles_empty_sides():
    a, b = accumulate(ROWS[:300]), accumulate(ROWS[300:])
    b_state = b.state_dict()
    empty = StreamingCovariance(DIM)
    empty.merge(a).merge(StreamingCovariance(DIM)).merge(b)
    _assert_same_state(empty, BASELINE)
    assert torch.equal(b.state_dict()["sum_outer"], b_state["sum_outer"]) and torch.equal(b.shift, b_state["shift"])


def test_merge_rejects_other_dimension():
    with pytest.raises(ValueError, match=r"dim 24.*dim 5"):
        StreamingCovariance(DIM).merge(StreamingCovariance(5))


@settings(max_examples=20, deadline=None)
@given(offset=st.floats(min_value=-3.0, max_value=3.0, allow_nan=False), seed=st.integers(0, 2**16))
def test_reshift_is_exact_algebra(offset: float, seed: int):
    """Moving the shift by up to 3 standard deviations per dimension (ranks' first-batch means differ by much less)
    changes nothing beyond 1e-12. Far-away shifts lose ~eps * (distance / std)^2 in the covariance, which is why the
    shift is a mean and not, say, zero."""
    acc = accumulate(ROWS, batch_rows=100)
    std = torch.from_numpy(ROWS.astype(np.float64).std(0))
    new_shift = acc.shift + offset * std * torch.from_numpy(np.random.default_rng(seed).standard_normal(DIM))
    acc.reshift(new_shift)
    assert torch.equal(acc.shift, new_shift)
    _assert_same_state(acc, BASELINE)


def test_reshift_of_empty_accumulator_adopts_the_shift():
    acc = StreamingCovariance(3)
    acc.reshift(torch.tensor([1.0, 2.0, 3.0]))
    assert acc.n == 0 and acc.shift.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match=r"\(3,\)"):
        acc.reshift(torch.zeros(4))


def test_first_rows_reset_a_placeholder_shift():
    """After an all-reduce where nobody had rows the shift is a zero placeholder; the first real batch replaces it."""
    acc = StreamingCovariance(DIM)
    acc.reshift(torch.zeros(DIM))
    acc.update(torch.from_numpy(ROWS))
    np.testing.assert_allclose(acc.shift.numpy(), ROWS.astype(np.float64).mean(0), rtol=1e-15)
    _assert_same_state(acc, BASELINE)


# ---------------------------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("shape", [(4, DIM + 1), (), (2, 3, 5)])
def test_wrong_last_dimension_is_a_clear_error(shape: tuple[int, ...]):
    acc = StreamingCovariance(DIM)
    with pytest.raises(ValueError, match=rf"expected last dimension {DIM}.*got shape {re_shape(shape)}"):
        acc.update(torch.zeros(shape))
    assert acc.n == 0


def re_shape(shape: tuple[int, ...]) -> str:
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


@pytest.mark.parametrize("bad", [dict(dim=0), dict(dim=2.5), dict(dim=True), dict(dim=4, gram_dtype=torch.float16)])
def test_constructor_validates(bad: dict):
    with pytest.raises(ValueError, match="StreamingCovariance"):
        StreamingCovariance(**bad)


def test_nonfinite_rows_are_counted_and_excluded_not_absorbed():
    x = torch.from_numpy(ROWS.copy())
    x[5, 3] = float("nan")
    x[17, 0] = float("inf")
    x[400, -1] = -float("inf")
    acc = StreamingCovariance(DIM)
    acc.update(x[:300])
    acc.update(x[300:])
    finite = np.delete(ROWS, [5, 17, 400], axis=0)
    assert (acc.n, acc.n_nonfinite) == (597, 3)
    ref = accumulate(finite, batch_rows=597)
    # the counts differ by design (3 dropped rows), the numbers must not:
    np.testing.assert_allclose(
        acc.covariance().numpy(), ref.covariance().numpy(), rtol=0, atol=1e-13 * np.abs(ref.covariance().numpy()).max()
    )
    spectrum = eigendecompose(acc.covariance(), acc.n, acc.n_nonfinite)
    assert summarize(acc.covariance(), spectrum)["n_nonfinite"] == 3


def test_a_batch_of_only_nonfinite_rows_sets_nothing_but_the_count():
    acc = StreamingCovariance(3)
    acc.update(torch.full((4, 3), float("nan")))
    assert (acc.n, acc.n_nonfinite, acc.shift) == (0, 4, None)
    acc.update(torch.zeros(0, 3))
    assert (acc.n, acc.n_nonfinite) == (0, 4)


def test_too_few_rows_give_documented_nans_not_exceptions():
    acc = StreamingCovariance(3)
    assert torch.isnan(acc.mean()).all() and torch.isnan(acc.covariance()).all()
    acc.update(torch.tensor([[1.0, 2.0, 3.0]]))
    assert acc.mean().tolist() == [1.0, 2.0, 3.0]
    assert torch.isnan(acc.covariance()).all()
    acc.update(torch.tensor([[2.0, 2.0, 5.0]]))
    torch.testing.assert_close(acc.covariance()[0], torch.tensor([0.5, 0.0, 1.0], dtype=torch.float64))


# ---------------------------------------------------------------------------------------------------- persistence
def test_state_dict_round_trip_resumes_exactly():
    acc = accumulate(ROWS[:250], batch_rows=50)
    acc.update(torch.tensor([[float("nan")] * DIM]))
    buffer = io.BytesIO()
    torch.save(acc.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert all(v.device.type == "cpu" for v in state.values() if isinstance(v, torch.Tensor))
    resumed = StreamingCovariance(DIM)
    resumed.load_state_dict(state)
    resumed.update(torch.from_numpy(ROWS[250:]))
    acc.update(torch.from_numpy(ROWS[250:]))
    assert torch.equal(packed(resumed), packed(acc)) and torch.equal(resumed.shift, acc.shift)
    assert resumed.n_nonfinite == 1


def test_load_state_dict_is_tolerant_but_rejects_a_dimension_mismatch():
    empty = StreamingCovariance(DIM)
    empty.load_state_dict({})
    assert empty.n == 0 and empty.shift is None
    with pytest.raises(ValueError, match=r"dim 7.*dim 24"):
        StreamingCovariance(DIM).load_state_dict(StreamingCovariance(7).state_dict())


def test_pack_unpack_round_trip_and_length_check():
    acc = accumulate(ROWS, batch_rows=100)
    other = StreamingCovariance(DIM)
    other.reshift(acc.shift)
    other.unpack_(packed(acc))
    assert torch.equal(other.covariance(), acc.covariance()) and other.n == acc.n
    with pytest.raises(ValueError, match=f"length {acc.packed_size}"):
        other.unpack_(torch.zeros(5))


# ---------------------------------------------------------------------------------------------------- strict float math
@pytest.fixture
def restore_precision_flags():
    """Tests below change global float32 settings; put every per-backend knob back afterwards."""
    knobs = [torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.mkldnn.matmul]
    saved = [k.fp32_precision for k in knobs]
    yield
    torch.set_float32_matmul_precision("highest")
    for knob, value in zip(knobs, saved, strict=False):
        knob.fp32_precision = value


@pytest.mark.usefixtures("restore_precision_flags")
@pytest.mark.parametrize(
    "loosen",
    [
        lambda: torch.set_float32_matmul_precision("medium"),  # legacy API; also makes CPU matmuls bf16
        lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),  # new API
        lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"),  # new API, CPU
    ],
    ids=["legacy_medium", "new_cuda_tf32", "new_cpu_bf16"],
)
def test_strict_math_inside_and_settings_restored_after(loosen, monkeypatch):
    loosen()
    before = (
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.mkldnn.matmul.fp32_precision,
        torch.backends.cudnn.conv.fp32_precision,
    )
    seen = {}
    real_mm = torch.mm

    def spy(a, b):
        seen.update(
            precision=torch.get_float32_matmul_precision(),
            cuda_tf32=torch.backends.cuda.matmul.allow_tf32,
            cudnn_tf32=torch.backends.cudnn.allow_tf32,
            cpu=torch.backends.mkldnn.matmul.fp32_precision,
            autocast=torch.is_autocast_enabled("cpu"),
        )
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", spy)
    acc = StreamingCovariance(DIM, gram_dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        acc.update(torch.from_numpy(ROWS))
        assert torch.is_autocast_enabled("cpu")
    assert seen == dict(precision="highest", cuda_tf32=False, cudnn_tf32=False, cpu="ieee", autocast=False)
    after = (
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.mkldnn.matmul.fp32_precision,
        torch.backends.cudnn.conv.fp32_precision,
    )
    assert after == before


def test_autocast_does_not_change_the_float32_gram():
    plain = accumulate(ROWS, gram_dtype=torch.float32, batch_rows=128)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = accumulate(ROWS, gram_dtype=torch.float32, batch_rows=128)
    assert torch.equal(packed(plain), packed(under))


def test_strict_fp32_math_restores_on_error():
    before = torch.backends.cudnn.conv.fp32_precision
    with pytest.raises(KeyError), strict_fp32_math("cpu"):
        raise KeyError("boom")
    assert torch.backends.cudnn.conv.fp32_precision == before


def test_float32_gram_is_close_but_float64_is_the_default():
    acc32 = accumulate(ROWS, gram_dtype=torch.float32, batch_rows=64)
    assert StreamingCovariance(DIM).gram_dtype == torch.float64
    errors = relative_errors(_summary(acc32), _summary(BASELINE), METRIC_KEYS)
    assert 0 < max(errors.values()) <= 1e-6
    assert not math.isnan(sum(errors.values()))


def test_works_inside_and_outside_inference_mode():
    """The observation pass runs under inference mode; merging and resuming happen outside it."""
    with torch.inference_mode():
        acc = StreamingCovariance(DIM)
        acc.update(torch.from_numpy(ROWS[:300]))
    acc.update(torch.from_numpy(ROWS[300:450]))
    with torch.inference_mode():
        acc.update(torch.from_numpy(ROWS[450:]))
        other = StreamingCovariance(DIM).merge(acc)
    other.merge(StreamingCovariance(DIM))
    _assert_same_state(acc, BASELINE)
    _assert_same_state(other, BASELINE)
    assert not packed(acc).is_inference()
