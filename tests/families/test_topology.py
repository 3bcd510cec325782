"""The topology family: ripser's Vietoris-Rips diagrams equal a brute-force H0 (union-find over the sorted edges) and
gudhi's H1, meet the closed forms (a sampled circle has one long H1 bar, two separated clusters one long H0 bar),
persim's distances meet theirs; the family records the metrics of the tokens materialised by plain hooks, 1 process =
2 or 3 simulated ranks with the same two collectives (`check_family`), and declares its settings and panels."""

from __future__ import annotations

import math

import gudhi
import numpy as np
import pytest
from scipy.spatial.distance import pdist, squareform

from tests.families.test_token_coupling import images, tiny_vit, tokens_of
from tgo import panels
from tgo.observatory.families import enabled_families
from tgo.observatory.families.testing import check_family
from tgo.observatory.families.topology import TOPOLOGY, TopologySettings
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
from tgo.observatory.points import vit_points
from tgo.observatory.settings import ObservationSettings, ObservationSettingsError
from tgo.records import RecordWriter, load_spectra, read_metric_rows
from tgo.spectral.topology import cloud_diagrams, diagram_distances, topology_metrics

POINTS = ("patch_embed", "pos_embed", "block_01", "block_02")  # every point that keeps all its tokens
CHOSEN = 3


def config(maxdim: int = 1) -> dict:
    return {
        "groups": 3,
        "probes": {"enabled": False},
        "attention": {"enabled": False},
        "topology": {"enabled": True, "images": CHOSEN, "maxdim": maxdim},
    }


def union_find_h0(cloud: np.ndarray) -> np.ndarray:
    """The finite H0 deaths of a Vietoris-Rips filtration, brute force: Kruskal's merges over the sorted edges."""
    d = squareform(pdist(cloud))
    parent = list(range(len(cloud)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    deaths = []
    n = len(cloud)
    for length, u, v in sorted((d[i, j], i, j) for i in range(n) for j in range(i + 1, n)):
        a, b = root(u), root(v)
        if a != b:
            parent[a] = b
            deaths.append(length)
    return np.array(deaths)


def test_h0_equals_union_find_and_h1_equals_gudhi():
    rng = np.random.default_rng(0)
    worst = 0.0
    for n, dim in ((12, 3), (20, 5), (30, 2)):
        cloud = rng.normal(size=(n, dim))
        got = cloud_diagrams(cloud, 1)
        h0 = got.diagrams[0]
        assert np.all(h0[:, 0] == 0) and np.isinf(h0[:, 1]).sum() == 1
        want = union_find_h0(cloud)
        np.testing.assert_allclose(np.sort(h0[np.isfinite(h0[:, 1]), 1]), want, rtol=1e-6)  # ripser: float32
        assert got.diameter == pytest.approx(pdist(cloud).max(), rel=1e-15)
        tree = gudhi.RipsComplex(points=cloud).create_simplex_tree(max_dimension=2)
        tree.compute_persistence(homology_coeff_field=2, min_persistence=0)
        h1 = tree.persistence_intervals_in_dimension(1)
        mine = got.diagrams[1]
        assert len(mine) == len(h1)
        np.testing.assert_allclose(mine[np.lexsort(mine.T[::-1])], h1[np.lexsort(h1.T[::-1])], rtol=1e-6)
        worst = max(worst, diagram_distances(mine, h1)[0] / got.diameter)
    assert worst < 1e-6


def test_closed_forms_circle_clusters_and_distances():
    rng = np.random.default_rng(1)
    angle = np.sort(rng.uniform(0, 2 * np.pi, 60))
    circle = np.column_stack([np.cos(angle), np.sin(angle), 0.01 * rng.normal(size=60)])
    metrics = dict((m, v) for m, v, _ in topology_metrics([cloud_diagrams(circle, 1)], None, 0.1))
    assert metrics["topology_betti_h1"] == 1  # one loop; its bar: from the largest gap to ~sqrt(3)
    h1 = cloud_diagrams(circle, 1).diagrams[1]
    longest = h1[np.argmax(h1[:, 1] - h1[:, 0])]
    assert longest[1] == pytest.approx(math.sqrt(3), rel=0.05)
    blobs = np.concatenate([rng.normal(size=(15, 4)) * 0.1, rng.normal(size=(15, 4)) * 0.1 + [10, 0, 0, 0]])
    clusters = cloud_diagrams(blobs, 0)
    gap = squareform(pdist(blobs))[:15, 15:].min()  # single linkage: the clusters merge at their nearest pair
    finite = clusters.diagrams[0][np.isfinite(clusters.diagrams[0][:, 1])]
    assert finite[:, 1].max() == pytest.approx(gap, rel=1e-6)
    assert dict((m, v) for m, v, _ in topology_metrics([clusters], None, 0.05))["topology_betti_h0"] == 2
    one_bar, empty = np.array([[0.0, 1.0]]), np.zeros((0, 2))
    assert diagram_distances(one_bar, empty) == pytest.approx((0.5, 1 / math.sqrt(2)))  # L-inf / Euclidean diagonal


def observe(net, data, run_dir, maxdim: int = 1):
    return observe_and_record(
        net,
        data,
        vit_points(net),
        settings=ObservationSettings.from_config(config(maxdim)),
        plan=ShardPlan(0, 1, 4),
        record=RecordPlan(RecordWriter(run_dir), epoch=0, step=0, with_covariance=True),
        all_reduce_sum=lambda t: t,
        is_global_zero=True,
    )


def test_the_family_records_the_topology_of_the_tokens_materialised(tmp_path):
    net, data = tiny_vit(), images()
    results = observe(net, data, tmp_path, maxdim=2)
    tokens = tokens_of(net, data.tensors[0][:CHOSEN])
    diagrams = {p: [cloud_diagrams(cloud, 2) for cloud in tokens[p]] for p in POINTS}
    for i, point in enumerate(POINTS):
        after = diagrams[POINTS[i + 1]] if i + 1 < len(POINTS) else None
        want = topology_metrics(diagrams[point], after, TopologySettings().threshold)
        got = results[(point, "all")]
        assert len(want) == (12 if after is not None else 6)
        for name, value, spread in want:
            assert got.observables[name] == pytest.approx(value, rel=1e-12, abs=1e-12), (point, name)
            assert got.stderr[name] == pytest.approx(spread, rel=1e-10, abs=1e-12), (point, name)
        kept = got.kept_arrays["topology_diagram_h1"]
        np.testing.assert_array_equal(kept[kept[:, 0] == 2, 1:], diagrams[point][2].diagrams[1])
    assert "topology_betti_h0" not in results[("cls", "all")].observables  # one token: no cloud
    rows = {(r["point"], r["metric"]) for r in read_metric_rows(tmp_path) if r["view"] == "all"}
    assert {(p, "topology_betti_h2") for p in POINTS} <= rows
    assert "topology_diagram_h2" in load_spectra(tmp_path, [0], view="all")[0]["block_02"]


def test_the_family_is_exact_on_simulated_ranks(tmp_path):
    check = check_family(TOPOLOGY, tiny_vit(), images(), tmp_path, settings=config(), world_size=3)
    assert {p for p, _, _ in check.metrics} == set(POINTS)
    assert all(len(c) == 2 for c in check.calls)


def test_settings_panels_and_refusal():
    assert TopologySettings() == TopologySettings(enabled=False, images=3, maxdim=1, threshold=0.05)
    assert TOPOLOGY not in enabled_families(ObservationSettings())  # off until make bench has measured it
    on = ObservationSettings.from_config(config())
    assert TOPOLOGY in enabled_families(on) and TOPOLOGY not in enabled_families(on, "step")  # epoch series only
    for key, value in (("images", 0), ("maxdim", 3), ("threshold", 1.0), ("enabled", "yes")):
        with pytest.raises(ObservationSettingsError, match=rf"topology\.{key}"):
            TopologySettings(**{key: value})  # type: ignore[arg-type]
    declared = {(p.kind, p.metric) for p in panels.declared() if p.metric.startswith("topology_")}
    assert {("depth", "topology_betti_h1"), ("bands", "topology_bottleneck_h1")} <= declared
