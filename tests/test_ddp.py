"""Multi-rank observation: CPU processes over gloo give exactly the single-process result, every image once."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from tests.conftest import NO_FIGURES, compose_train
from tests.processes import fork_ranks, free_port, tiny_vit
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record, observe_dataset
from tgo.observatory.points import vit_points
from tgo.observatory.settings import ObservationSettings
from tgo.records import RecordWriter, load_series, load_spectra
from tgo.spectral import GroupedCovariance

EPOCH0 = [
    "experiment=smoke",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=1",
    "trainer.limit_val_batches=1",
    "data.analysis.per_class=7",
    *NO_FIGURES,  # the records are compared, not figures (rendered on rank 0 only, they were most of a run's time)
]  # 70 images: 35 per rank on 2 ranks


@pytest.mark.slow
def test_two_process_ddp_equals_one_process(tmp_path):
    """Epoch 0 (before any update, same seed) of a 2-process DDP run against a 1-process run; and the default
    summary (in the background, shared by the 2 ranks, gathered over TGO's gloo group) records bitwise what rank 0
    alone records inline from the same reduction."""
    # Not at the top: a rank that fork_ranks spawns (when it cannot fork) imports this module, Lightning-free.
    from tgo.train import run

    single, double, inline = tmp_path / "single", tmp_path / "ddp", tmp_path / "ddp_inline"
    # With the step series (observation.early: steps 0 and 1 of this one-step epoch), whose due steps the ranks decide
    # together (rank 0's broadcast at due steps only) and whose summary is shared like the epoch series'.
    ddp = ["trainer.devices=2", "observation.early.enabled=true"]
    run(compose_train(single, EPOCH0))
    run(compose_train(double, [*EPOCH0, *ddp, "trainer.strategy=ddp_spawn"]))
    # The reference's ranks are forked from this process (ddp_fork): the same ranks and sums without two fresh
    # interpreters; ddp_spawn (the callback pickled to its ranks) is what the run under test uses.
    inline_only = ["observation.summary.background=false", "observation.summary.share=false"]
    run(compose_train(inline, [*EPOCH0, *ddp, "trainer.strategy=ddp_fork", *inline_only]))
    assert (double / "geometry" / "metrics.csv").read_bytes() == (inline / "geometry" / "metrics.csv").read_bytes()
    steps = [double / "geometry" / "steps", inline / "geometry" / "steps"]
    assert (steps[0] / "metrics.csv").read_bytes() == (steps[1] / "metrics.csv").read_bytes()
    assert sorted(p.name for p in (steps[0] / "spectra").iterdir()) == ["step_000000.npz", "step_000001.npz"]
    shared_spectra = load_spectra(double)
    for epoch, points in load_spectra(inline).items():
        for name, arrays in points.items():
            for key, array in arrays.items():
                shared = shared_spectra[epoch][name][key]
                assert np.asarray(shared).tobytes() == np.asarray(array).tobytes(), (epoch, name, key)
    one, two = load_spectra(single)[0], load_spectra(double)[0]
    assert list(one) == list(two)
    for name in one:
        assert int(two[name]["n_rows"]) == int(one[name]["n_rows"])
        np.testing.assert_allclose(
            two[name]["eigenvalues"],
            one[name]["eigenvalues"],
            rtol=1e-10,
            atol=1e-10 * one[name]["eigenvalues"][0],
            err_msg=name,
        )
        np.testing.assert_allclose(two[name]["mean"], one[name]["mean"], rtol=1e-10, atol=1e-12)
    assert int(one["block_01"]["n_rows"]) == 70 * 17 and int(one["cls"]["n_rows"]) == 70
    # The jackknife (default 10 groups) travels in the same collectives: its standard errors agree too.
    se_one, se_two = load_series(single, column="stderr"), load_series(double, column="stderr")
    for metric in ("effective_rank", "participation_ratio", "spectral_anisotropy", "effective_rank_vs_noise"):
        for name, (epochs, values) in se_one[metric].items():
            assert epochs[0] == 0 and np.isfinite(values[0]) and values[0] > 0, (metric, name)
            assert se_two[metric][name][1][0] == pytest.approx(values[0], rel=1e-10), (metric, name)


def _images(count: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(count, 3, 16, 16, generator=generator), torch.zeros(count, dtype=torch.long))


def _states(accumulators: dict) -> dict:
    """Per point: ``[(n, covariance)]`` of every group (one entry without groups)."""
    out = {}
    for name, acc in accumulators.items():
        parts = acc.groups if isinstance(acc, GroupedCovariance) else [acc]
        out[name] = [(part.n, part.covariance()) for part in parts]
    return out


def _worker(rank: int, world_size: int, port: int, count: int, groups: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    calls = []

    def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        calls.append(tensor.numel())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    net = tiny_vit()
    accumulators = observe_dataset(
        net,
        _images(count),
        vit_points(net),
        plan=ShardPlan(rank, world_size, 2),
        all_reduce_sum=all_reduce_sum,
        groups=groups,
    )
    if rank == 0:
        torch.save(_states(accumulators) | {"calls": calls}, out)
    dist.barrier()  # no rank tears gloo down while another still uses it (an abort under load)
    dist.destroy_process_group()


# Uneven shards with jackknife groups (2 ranks, 7 images, 3 groups) are covered, with every view, probe and standard
# error, by test_probes_on_two_processes_with_uneven_shards_equal_one_process (one spawn fewer for the suite).
@pytest.mark.parametrize(("world_size", "count", "groups"), [(3, 2, 0)], ids=["an-empty-shard"])
@pytest.mark.slow
def test_uneven_and_empty_shards_count_every_image_once(tmp_path: Path, world_size: int, count: int, groups: int):
    net = tiny_vit()  # first: the forked ranks find timm imported
    reference = _states(
        observe_dataset(
            net, _images(count), vit_points(net), plan=ShardPlan(0, 1, 2), all_reduce_sum=lambda t: t, groups=groups
        )
    )
    out = str(tmp_path / "rank0.pt")
    fork_ranks(_worker, (world_size, free_port(), count, groups, out), world_size)
    result = torch.load(out, weights_only=True)
    assert len(result.pop("calls")) == 2, "two collectives per observation, whatever the shard sizes and groups"
    for name, parts in reference.items():
        assert len(result[name]) == len(parts) == max(groups, 1)
        for (n, cov), (n_ref, cov_ref) in zip(result[name], parts, strict=True):
            assert n == n_ref, name
            torch.testing.assert_close(cov, cov_ref, rtol=1e-10, atol=1e-12, equal_nan=True)
    assert sum(n for n, _ in result["block_01"]) == count * 17


@pytest.mark.parametrize(("length", "world_size"), [(1001, 2), (1000, 8), (2, 3), (0, 2)])
def test_shards_are_disjoint_cover_everything_and_never_pad(length, world_size):
    from tgo.observatory.pipeline import ShardSampler

    shards = [list(ShardSampler(length, rank, world_size)) for rank in range(world_size)]
    flat = [i for shard in shards for i in shard]
    assert sorted(flat) == list(range(length)), "every image exactly once"
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


# ----------------------------------------------------------------------------------- hypothesis probes over ranks
PROBE_IMAGES = 7  # 4 + 3 images on 2 ranks


def _labelled_images(count: int) -> TensorDataset:
    images = _images(count).tensors[0]
    return TensorDataset(images, torch.arange(count) % 3)


def _observe_with_probes(rank: int, world_size: int, all_reduce_sum, run_dir: Path, enabled: bool):
    """`observe_and_record` of the labelled images with 3 jackknife groups; ``(results or None, collective calls)``."""
    calls = []

    def counted(tensor: torch.Tensor) -> torch.Tensor:
        calls.append(tensor.numel())
        return all_reduce_sum(tensor)

    net = tiny_vit()
    settings = ObservationSettings(groups=3, probes={"enabled": enabled, "folds": 3}, attention={"enabled": False})
    results = observe_and_record(
        net,
        _labelled_images(PROBE_IMAGES),
        vit_points(net),
        settings=settings,
        plan=ShardPlan(rank, world_size, 2),
        record=RecordPlan(RecordWriter(run_dir), epoch=0, step=0, with_covariance=True),
        all_reduce_sum=counted,
        is_global_zero=rank == 0,
    )
    return results, calls


def _plain(results) -> dict:
    """Per (point, view): covariance, observables, standard errors and arrays (picklable, no tgo types)."""
    return {
        tuple(key): {
            "covariance": r.covariance,
            "observables": dict(r.observables),
            "stderr": dict(r.stderr),
            "arrays": {**r.arrays, **r.kept_arrays},
        }
        for key, r in results.items()
    }


def _probe_worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    on, calls_on = _observe_with_probes(rank, world_size, all_reduce_sum, Path(out).parent / "on", True)
    off, calls_off = _observe_with_probes(rank, world_size, all_reduce_sum, Path(out).parent / "off", False)
    if rank == 0:
        torch.save({"on": _plain(on), "off": _plain(off), "calls": (calls_on, calls_off)}, out)
    dist.barrier()  # no rank tears gloo down while another still uses it (an abort under load)
    dist.destroy_process_group()


@pytest.mark.slow
def test_probes_on_two_processes_with_uneven_shards_equal_one_process(tmp_path: Path):
    """Every view's covariance, every probe metric and standard error, the gathered per-image vectors: as on one
    process; and the per-image vectors ride in the same two collectives (probes on or off)."""
    from tgo.observatory.families.phases import PHASES
    from tgo.spectral import CATALOGUE
    from tgo.spectral.probes import subspace_overlap

    singles = {  # first: the forked ranks find what one process imports imported
        enabled: _plain(_observe_with_probes(0, 1, lambda t: t, tmp_path / f"single_{enabled}", enabled)[0])
        for enabled in (True, False)
    }
    out = tmp_path / "ddp" / "rank0.pt"
    out.parent.mkdir()
    fork_ranks(_probe_worker, (2, free_port(), str(out)), 2)
    ddp = torch.load(out, weights_only=False)  # its own workers wrote it (numpy arrays inside)
    calls_on, calls_off = ddp["calls"]
    assert len(calls_on) == len(calls_off) == 2, "two collectives per observation, probes on or off"
    assert calls_on[0] == calls_off[0] and calls_on[1] > calls_off[1], "the per-image vectors ride in the second"
    phases = {o.name for o in PHASES.observables}  # recorded with probes on or off (tests/observatory/test_phases_*)
    probe_names = [o.name for o in CATALOGUE.family_entries if o.name not in phases]
    for enabled in (True, False):
        one, two = singles[enabled], ddp["on" if enabled else "off"]
        assert list(two) == list(one)
        assert {view for _, view in one if not view.startswith("weights_")} == (
            {"all", "cls", "patch", "between_image", "within_image", "network"} if enabled else {"all", "network"}
        )  # beside the weights family's views and its trajectory over the network (tests/families/test_weights.py)
        for key, want in one.items():
            got = two[key]
            if not want["covariance"].size:  # a view with metrics only (the weights'): compared as metrics below
                assert got["observables"] == pytest.approx(want["observables"], rel=1e-12, nan_ok=True), key
                continue
            scale = np.abs(want["covariance"]).max()
            np.testing.assert_allclose(got["covariance"], want["covariance"], rtol=1e-10, atol=1e-10 * scale)
            present = [m for m in probe_names if m in want["observables"]]
            assert enabled or not present, key
            for metric in present:
                for column in ("observables", "stderr"):
                    a, b = got[column][metric], want[column][metric]
                    assert a == pytest.approx(b, rel=1e-10, abs=1e-14, nan_ok=True), (key, metric, column)
            assert list(got["arrays"]) == list(want["arrays"]), key
            for name, array in want["arrays"].items():
                if name == "eigenvectors":  # a basis of the leading eigenspace: compare spans, not signs
                    # (only the directions with variance: the cls point has 7 rows, so C has rank 6 < k = 10)
                    eigs = np.linalg.eigvalsh(want["covariance"])[::-1]
                    defined = min(array.shape[1], int(np.sum(eigs > 1e-9 * eigs[0])))
                    overlap = subspace_overlap(got["arrays"][name][:, :defined], array[:, :defined])
                    assert overlap == pytest.approx(1.0, abs=1e-10), key
                else:
                    np.testing.assert_allclose(got["arrays"][name], array, rtol=1e-10, err_msg=f"{key} {name}")
        if enabled:  # the comparison covered real numbers, not NaN = NaN
            cls = one[("block_02", "cls")]
            for metric in ("fisher_ratio", "nc1", "ncc_accuracy", "ridge_accuracy"):
                assert np.isfinite(cls["observables"][metric]) and np.isfinite(cls["stderr"][metric]), metric
            assert np.isfinite(one[("block_02", "all")]["stderr"]["between_image_fraction"])
