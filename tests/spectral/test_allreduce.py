"""allreduce_accumulators over simulated ranks: equals one accumulator over all rows, in exactly two collectives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.spectral.simulated_world import SimulatedWorld
from tests.spectral.spectral_data import make_rows, packed, power_law_spectrum
from tgo.spectral import StreamingCovariance, allreduce_accumulators

# Three observation points of different widths; the third is never fed on any rank.
DIMS = (16, 24, 8)
ROWS = [make_rows(400, power_law_spectrum(d), massive=2, seed=20 + i) for i, d in enumerate(DIMS[:2])]


def _single(point: int) -> StreamingCovariance:
    acc = StreamingCovariance(DIMS[point])
    acc.update(torch.from_numpy(ROWS[point]))
    return acc


def _rank_program(assignment: list[np.ndarray]):
    """Each rank streams its rows (in ragged batches) into one accumulator per point, then all-reduces."""

    def program(rank: int, all_reduce_sum) -> list[StreamingCovariance]:
        accs = [StreamingCovariance(d) for d in DIMS]
        for point in range(2):
            mine = ROWS[point][assignment[point] == rank]
            for chunk in np.array_split(mine, 3):
                accs[point].update(torch.from_numpy(chunk))
        allreduce_accumulators(accs, all_reduce_sum)
        return accs

    return program


def _check(world: SimulatedWorld, per_rank: list[list[StreamingCovariance]]) -> None:
    assert world.calls == [2] * world.world_size  # whatever the points, rows or world size
    for point in range(2):
        want = _single(point)
        for accs in per_rank:
            got = accs[point]
            assert (got.n, got.n_nonfinite) == (want.n, want.n_nonfinite)
            c_got, c_want = got.covariance().numpy(), want.covariance().numpy()
            assert np.abs(c_got - c_want).max() <= 1e-12 * np.abs(c_want).max()
            np.testing.assert_allclose(got.mean().numpy(), want.mean().numpy(), rtol=1e-12)
        # every rank holds bit-identical state afterwards (rank 0 is not special)
        assert all(torch.equal(packed(accs[point]), packed(per_rank[0][point])) for accs in per_rank)
    for accs in per_rank:  # the unfed point: no rows anywhere, a zero shift, NaN statistics
        assert accs[2].n == 0 and torch.equal(accs[2].shift, torch.zeros(DIMS[2], dtype=torch.float64))
        assert torch.isnan(accs[2].covariance()).all()


@settings(max_examples=15, deadline=None)
@given(world_size=st.integers(1, 5), seed=st.integers(0, 2**16), in_place=st.booleans())
def test_simulated_ranks_equal_one_accumulator(world_size: int, seed: int, in_place: bool):
    rng = np.random.default_rng(seed)
    # uneven shards; with small probability a rank gets nothing at all for a point
    assignment = [rng.choice(world_size, size=400, p=rng.dirichlet(np.full(world_size, 0.7))) for _ in range(2)]
    world = SimulatedWorld(world_size, in_place=in_place)
    _check(world, world.run(_rank_program(assignment)))


def test_a_rank_without_any_rows_still_takes_part():
    assignment = [np.zeros(400, dtype=int), np.zeros(400, dtype=int)]  # rank 1 and 2 see nothing
    world = SimulatedWorld(3)
    _check(world, world.run(_rank_program(assignment)))


def test_two_collectives_carry_shift_agreement_then_packed_state():
    world = SimulatedWorld(2)
    world.run(_rank_program([np.arange(400) % 2, np.arange(400) % 2]))
    assert world.payload_numel == [sum(1 + d for d in DIMS), sum(2 + d + d * d for d in DIMS)]


def test_nonfinite_counts_are_summed_across_ranks():
    def program(rank: int, all_reduce_sum) -> StreamingCovariance:
        acc = StreamingCovariance(4)
        acc.update(torch.randn(10, 4, generator=torch.Generator().manual_seed(rank)))
        acc.update(torch.full((rank + 1, 4), float("nan")))
        allreduce_accumulators([acc], all_reduce_sum)
        return acc

    accs = SimulatedWorld(3).run(program)
    assert all((a.n, a.n_nonfinite) == (30, 1 + 2 + 3) for a in accs)


def test_no_points_means_no_collectives():
    world = SimulatedWorld(2)
    world.run(lambda rank, reduce: allreduce_accumulators([], reduce))
    assert world.calls == [0, 0]


def test_harness_catches_mismatched_collectives():
    """The simulation enforces the collective rule, so it can catch rank-dependent calls."""

    def program(rank: int, all_reduce_sum) -> None:
        all_reduce_sum(torch.zeros(3 + rank))

    with pytest.raises(RuntimeError, match="a rank failed"):
        SimulatedWorld(2, timeout=5).run(program)
