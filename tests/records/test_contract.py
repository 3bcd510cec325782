"""Records: the on-disk contract (schema), round trip, atomic writes under simulated crashes, resume, reader errors."""

from __future__ import annotations

import csv
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tgo.errors import RunEnvironmentError, UserInputError
from tgo.records import (
    JACKKNIFE_ARRAYS,
    JACKKNIFE_METRICS,
    METRICS_COLUMNS,
    RecordsError,
    RecordWriter,
    RunDir,
    atomic_write,
    load_jackknife,
    load_metrics,
    load_series,
    load_spectra,
    recorded_epochs,
)
from tgo.spectral import jackknife_stderr


def spectra_path(run_dir: Path, epoch: int) -> Path:
    return RunDir(run_dir).spectra(epoch)


POINTS = ("patch_embed", "block_01", "cls")
DIM = 6


def fake_results(seed: int, points=POINTS, nan_point: str | None = None) -> dict[str, SimpleNamespace]:
    """Results shaped like tgo.observatory.PointResult (duck-typed: the writer needs only these attributes)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in points:
        a = rng.normal(size=(40, DIM))
        cov = np.cov(a, rowvar=False)
        eigs = np.linalg.eigvalsh(cov)[::-1].copy()
        obs = {
            "effective_rank": float(rng.uniform(1, DIM)),
            "stable_rank": float(rng.uniform(1, DIM)),
            "spectral_flatness": 1e-300 * rng.uniform(),
        }
        if name == nan_point:
            obs["effective_rank"] = math.nan
        out[name] = SimpleNamespace(
            spectrum=SimpleNamespace(eigenvalues=eigs, n_rows=40, n_nonfinite=0),
            observables=obs,
            mean=a.mean(0),
            covariance=cov,
        )
    return out


def read_csv_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "geometry" / "metrics.csv", encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file under geometry/ with its bytes, to prove a failed write changed nothing."""
    root = run_dir / "geometry"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------------------------------- schema
def test_metrics_csv_schema_and_value_format(tmp_path):
    results = fake_results(0, nan_point="cls")
    RecordWriter(tmp_path).write_observation(epoch=3, step=120, results=results, with_covariance=False)
    text = (tmp_path / "geometry" / "metrics.csv").read_text(encoding="utf-8")
    assert text.splitlines()[0] == "epoch,step,point,view,metric,value,stderr"
    rows = read_csv_rows(tmp_path)
    assert len(rows) == len(POINTS) * 3
    assert [r["point"] for r in rows[:3]] == ["patch_embed"] * 3  # point order, then metric order
    first = rows[0]
    assert (first["epoch"], first["step"], first["view"], first["metric"]) == ("3", "120", "all", "effective_rank")
    assert first["value"] == repr(results["patch_embed"].observables["effective_rank"])  # shortest exact repr
    nan_row = next(r for r in rows if r["point"] == "cls" and r["metric"] == "effective_rank")
    assert nan_row["value"] == "nan"


def test_spectra_npz_schema(tmp_path):
    results = fake_results(0)
    writer = RecordWriter(tmp_path)
    writer.write_observation(epoch=7, step=70, results=results, with_covariance=False)
    writer.write_observation(epoch=8, step=80, results=results, with_covariance=True)
    path = tmp_path / "geometry" / "spectra" / "epoch_0007.npz"
    assert path == spectra_path(tmp_path, 7) and path.is_file()
    with np.load(path) as data:
        assert sorted(data.files) == sorted(
            f"{p}/{k}" for p in POINTS for k in ("eigenvalues", "n_rows", "n_nonfinite", "mean")
        )
        eig = data["cls/eigenvalues"]
        assert eig.dtype == np.float64 and np.all(np.diff(eig) <= 0)
        assert data["cls/n_rows"].shape == () and int(data["cls/n_rows"]) == 40
        assert data["cls/mean"].dtype == np.float64 and data["cls/mean"].shape == (DIM,)
    with np.load(spectra_path(tmp_path, 8)) as data:
        assert data["block_01/covariance"].shape == (DIM, DIM)
        np.testing.assert_array_equal(data["block_01/covariance"], results["block_01"].covariance)


# ------------------------------------------------------------------------------------------------------- round trip
def test_round_trip(tmp_path):
    writer = RecordWriter(tmp_path)
    written = {0: fake_results(0, nan_point="block_01"), 5: fake_results(1)}
    for epoch, res in written.items():
        writer.write_observation(epoch, epoch * 10, res, with_covariance=epoch == 0)

    metrics = load_metrics(tmp_path)
    assert list(metrics.columns) == list(METRICS_COLUMNS)
    assert str(metrics["epoch"].dtype) == "int64" and str(metrics["value"].dtype) == "float64"
    for epoch, res in written.items():
        for point, r in res.items():
            for metric, value in r.observables.items():
                rows = (metrics["epoch"] == epoch) & (metrics["point"] == point) & (metrics["metric"] == metric)
                got = metrics[rows]["value"]
                assert len(got) == 1
                assert (math.isnan(value) and math.isnan(got.iloc[0])) or got.iloc[0] == value  # bit-exact

    spectra = load_spectra(tmp_path)
    assert list(spectra) == [0, 5] and list(spectra[0]) == list(POINTS)
    for epoch, res in written.items():
        for point, r in res.items():
            arrays = spectra[epoch][point]
            np.testing.assert_array_equal(arrays["eigenvalues"], r.spectrum.eigenvalues)
            np.testing.assert_array_equal(arrays["mean"], r.mean)
            assert int(arrays["n_rows"]) == 40 and int(arrays["n_nonfinite"]) == 0
            assert ("covariance" in arrays) == (epoch == 0)
    assert list(load_spectra(tmp_path, epochs=[5])) == [5]

    series = load_series(tmp_path)
    assert list(series) == ["effective_rank", "stable_rank", "spectral_flatness"]
    assert list(series["stable_rank"]) == list(POINTS)
    epochs, values = series["stable_rank"]["cls"]
    assert epochs.tolist() == [0, 5] and values.tolist() == [
        written[e]["cls"].observables["stable_rank"] for e in (0, 5)
    ]
    assert list(load_series(tmp_path, metrics=["stable_rank"])) == ["stable_rank"]
    assert recorded_epochs(tmp_path) == [0, 5]


def test_load_series_refuses_an_unknown_view_or_metric_naming_the_known_ones(tmp_path):
    """A typo is refused in one line naming the known names; a name TGO knows but this run did not record is no data."""
    RecordWriter(tmp_path).write_observation(0, 0, fake_results(0), with_covariance=False)
    for call, wrong, known in [
        ({"view": "within-image"}, "view 'within-image'", "all, cls, prefix, patch, between_image, within_image, "),
        ({"metrics": ["stable_rank", "efective_rank"]}, "metric 'efective_rank'", "effective_rank, "),
        ({"view": "atention"}, "view 'atention'", "attention, weights_qkv"),  # a family's view
    ]:
        with pytest.raises(UserInputError, match=rf"^load_series: unknown {wrong} \(did you mean .*; .*{known}") as no:
            load_series(tmp_path, **call)
        assert "\n" not in str(no.value)
    assert load_series(tmp_path, view="within_image") == load_series(tmp_path, view="attention") == {}
    assert load_series(tmp_path, view="cls", metrics=["participation_ratio", "attention_entropy"]) == {}
    assert list(load_series(tmp_path, metrics=["stable_rank", "participation_ratio"])) == ["stable_rank"]


def test_large_epoch_numbers_and_point_results_from_the_observatory(tmp_path):
    """Epochs past 9999 still sort and load; the real PointResult type is accepted as is."""
    from tgo.observatory import PointResult

    r = fake_results(0)["cls"]
    real = {"cls": PointResult(spectrum=r.spectrum, observables=r.observables, mean=r.mean, covariance=r.covariance)}
    RecordWriter(tmp_path).write_observation(12345, 1, real, with_covariance=False)
    assert (tmp_path / "geometry" / "spectra" / "epoch_12345.npz").is_file()
    assert list(load_spectra(tmp_path)) == [12345]


def test_write_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="epoch"):
        RecordWriter(tmp_path).write_observation(-1, 0, fake_results(0), with_covariance=False)
    with pytest.raises(ValueError, match="npz key"):
        RecordWriter(tmp_path).write_observation(0, 0, {"a/b": fake_results(0)["cls"]}, with_covariance=False)


# --------------------------------------------------------------------------------------------------- atomic writes
def test_crash_while_writing_spectra_leaves_earlier_records_intact(tmp_path, monkeypatch):
    writer = RecordWriter(tmp_path)
    writer.write_observation(0, 0, fake_results(0), with_covariance=True)
    writer.write_observation(1, 10, fake_results(1), with_covariance=False)
    before = snapshot(tmp_path)
    real_savez = np.savez

    def savez_then_die(file, **arrays):
        real_savez(file, **dict(list(arrays.items())[:2]))  # part of the archive reaches the disk
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", savez_then_die)
    with pytest.raises(OSError, match="disk full"):
        writer.write_observation(2, 20, fake_results(2), with_covariance=False)  # a new epoch
    with pytest.raises(OSError, match="disk full"):
        writer.write_observation(1, 10, fake_results(3), with_covariance=False)  # overwriting an existing epoch
    assert snapshot(tmp_path) == before  # byte-identical, and no temporary files left behind
    monkeypatch.undo()
    assert recorded_epochs(tmp_path) == [0, 1]
    np.testing.assert_array_equal(
        load_spectra(tmp_path)[1]["cls"]["eigenvalues"], fake_results(1)["cls"].spectrum.eigenvalues
    )


def test_crash_while_replacing_metrics_keeps_the_old_table(tmp_path, monkeypatch):
    writer = RecordWriter(tmp_path)
    writer.write_observation(0, 0, fake_results(0), with_covariance=False)
    old_csv = (tmp_path / "geometry" / "metrics.csv").read_bytes()
    real_replace = os.replace

    def replace_but_not_metrics(src, dst):
        if str(dst).endswith("metrics.csv"):
            raise OSError("killed")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_but_not_metrics)
    with pytest.raises(OSError, match="killed"):
        writer.write_observation(1, 10, fake_results(1), with_covariance=False)
    monkeypatch.undo()
    assert (tmp_path / "geometry" / "metrics.csv").read_bytes() == old_csv
    assert not [p for p in (tmp_path / "geometry").rglob(".*")]  # temporaries cleaned up
    # the spectra of epoch 1 landed but its metrics did not: epoch 1 does not count as observed, so it is redone
    assert spectra_path(tmp_path, 1).is_file() and recorded_epochs(tmp_path) == [0]
    writer.write_observation(1, 10, fake_results(1), with_covariance=False)
    assert recorded_epochs(tmp_path) == [0, 1]
    assert len(read_csv_rows(tmp_path)) == 2 * len(POINTS) * 3


def test_readers_ignore_stale_temporaries(tmp_path):
    RecordWriter(tmp_path).write_observation(0, 0, fake_results(0), with_covariance=False)
    (tmp_path / "geometry" / "spectra" / ".epoch_0001.npz.abc.tmp").write_bytes(b"half an archive")
    assert list(load_spectra(tmp_path)) == [0]


# ----------------------------------------------------------------------------------------------------------- resume
def test_resume_rewrites_an_epoch_without_duplicate_rows(tmp_path):
    first = RecordWriter(tmp_path)
    for epoch in (0, 2, 4):
        first.write_observation(epoch, epoch * 10, fake_results(epoch), with_covariance=False)
    rows_before = read_csv_rows(tmp_path)

    resumed = RecordWriter(tmp_path)  # a new process after a restart: state comes from disk
    assert recorded_epochs(tmp_path) == [0, 2, 4]
    replacement = fake_results(99)
    resumed.write_observation(2, 21, replacement, with_covariance=False)  # epoch 2 observed again
    resumed.write_observation(6, 60, fake_results(6), with_covariance=False)

    rows = read_csv_rows(tmp_path)
    keys = [(r["epoch"], r["point"], r["metric"]) for r in rows]
    assert len(keys) == len(set(keys)) == 4 * len(POINTS) * 3
    assert [int(r["epoch"]) for r in rows] == sorted(int(r["epoch"]) for r in rows)
    assert [r for r in rows if r["epoch"] in ("0", "4")] == [r for r in rows_before if r["epoch"] in ("0", "4")]
    epoch2 = [r for r in rows if r["epoch"] == "2"]
    assert {r["step"] for r in epoch2} == {"21"}
    assert float(epoch2[0]["value"]) == replacement["patch_embed"].observables["effective_rank"]
    assert recorded_epochs(tmp_path) == [0, 2, 4, 6]


# ---------------------------------------------------------------------------------------------------------- readers
def test_reader_errors(tmp_path):
    with pytest.raises(RecordsError, match="not a directory"):
        load_metrics(tmp_path / "missing")
    with pytest.raises(RecordsError, match="no geometry records"):
        load_spectra(tmp_path)
    (tmp_path / "geometry" / "spectra").mkdir(parents=True)
    assert not RunDir(tmp_path).has_records()
    with pytest.raises(RecordsError, match="no geometry records"):
        load_series(tmp_path)

    RecordWriter(tmp_path).write_observation(0, 0, fake_results(0), with_covariance=False)
    assert RunDir(tmp_path).has_records()
    with pytest.raises(RecordsError, match="no spectra for epoch 3"):
        load_spectra(tmp_path, epochs=[3])

    (tmp_path / "geometry" / "metrics.csv").write_text("epoch,point,value\n0,cls,1.0\n", encoding="utf-8")
    with pytest.raises(RecordsError, match="header"):
        load_metrics(tmp_path)
    (tmp_path / "geometry" / "metrics.csv").unlink()
    with pytest.raises(RecordsError, match=r"metrics.csv is missing"):
        load_metrics(tmp_path)

    spectra_path(tmp_path, 0).write_bytes(b"not a zip")
    with pytest.raises(RecordsError, match="unreadable"):
        load_spectra(tmp_path)


def test_records_error_is_a_value_error():
    assert issubclass(RecordsError, ValueError)


def test_load_metrics_without_pandas_says_what_to_install(tmp_path, monkeypatch):
    RecordWriter(tmp_path).write_observation(0, 0, fake_results(0), with_covariance=False)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install"):
        load_metrics(tmp_path)
    assert list(load_spectra(tmp_path)) == [0]  # numpy-only reader still works


# ------------------------------------------------------------------------------------------------------------ views
def test_views_are_recorded_beside_the_default_view_and_read_separately(tmp_path):
    from tgo.observatory import ObservationKey

    base = fake_results(0)
    other = fake_results(1)
    results = {
        ObservationKey("block_01"): base["block_01"],
        ObservationKey("block_01", "cls"): other["block_01"],
        ObservationKey("cls"): base["cls"],
    }
    RecordWriter(tmp_path).write_observation(0, 0, results, with_covariance=True)
    rows = read_csv_rows(tmp_path)
    assert [(r["point"], r["view"]) for r in rows[::3]] == [("block_01", "all"), ("block_01", "cls"), ("cls", "all")]
    with np.load(spectra_path(tmp_path, 0)) as data:
        assert "block_01/eigenvalues" in data.files and "block_01/cls/eigenvalues" in data.files
    default = load_spectra(tmp_path)[0]
    assert list(default) == ["block_01", "cls"]
    np.testing.assert_array_equal(default["block_01"]["eigenvalues"], base["block_01"].spectrum.eigenvalues)
    cls_view = load_spectra(tmp_path, view="cls", arrays=("eigenvalues",))[0]
    assert list(cls_view) == ["block_01"] and list(cls_view["block_01"]) == ["eigenvalues"]
    np.testing.assert_array_equal(cls_view["block_01"]["eigenvalues"], other["block_01"].spectrum.eigenvalues)
    assert (
        load_series(tmp_path, view="cls")["effective_rank"]["block_01"][1][0]
        == other["block_01"].observables["effective_rank"]
    )
    assert set(load_metrics(tmp_path)["view"]) == {"all", "cls"}


@pytest.mark.parametrize(
    "columns", [("epoch", "step", "point", "metric", "value"), ("epoch", "step", "point", "view", "metric", "value")]
)
def test_files_written_before_views_and_stderr_existed_read_as_defaults(tmp_path, columns):
    RecordWriter(tmp_path).write_observation(0, 0, fake_results(0), with_covariance=False)
    path = RunDir(tmp_path).metrics
    legacy = [",".join(columns)] + [",".join(r[c] for c in columns) for r in read_csv_rows(tmp_path)]
    path.write_text("\n".join(legacy) + "\n", encoding="utf-8")
    frame = load_metrics(tmp_path)
    assert set(frame["view"]) == {"all"} and frame["stderr"].isna().all()
    assert recorded_epochs(tmp_path) == [0]
    RecordWriter(tmp_path).write_observation(1, 10, fake_results(1), with_covariance=False)  # upgraded on rewrite
    assert path.read_text(encoding="utf-8").splitlines()[0] == ",".join(METRICS_COLUMNS)
    assert recorded_epochs(tmp_path) == [0, 1]


def test_standard_errors_are_recorded_beside_values(tmp_path):
    results = fake_results(0)
    results["cls"].stderr = {"effective_rank": 0.125}
    RecordWriter(tmp_path).write_observation(0, 0, results, with_covariance=False)
    stderr = load_series(tmp_path, column="stderr")
    assert stderr["effective_rank"]["cls"][1].tolist() == [0.125]
    assert np.isnan(stderr["stable_rank"]["cls"][1][0]) and np.isnan(stderr["effective_rank"]["block_01"][1][0])
    with pytest.raises(ValueError, match="column"):
        load_series(tmp_path, column="mean")


# ------------------------------------------------------------------------------------------------ jackknife replicates
def with_replicates(results: dict[str, SimpleNamespace], seed: int, groups: int = 4) -> dict[str, SimpleNamespace]:
    """``fake_results`` with leave-one-out values (``groups`` per metric, 3 for the last: another jackknife's folds)
    and their standard errors, as the observatory records them."""
    rng = np.random.default_rng(100 + seed)
    for r in results.values():
        names = list(r.observables)
        r.jackknife = {m: rng.normal(size=3 if m == names[-1] else groups) for m in names}
        r.stderr = {m: jackknife_stderr(v) for m, v in r.jackknife.items()}
    return results


def test_replicates_are_stored_compactly_on_every_epoch(tmp_path):
    """The metric names once per file (ASCII bytes); per (point, view) only the table and the group counts."""
    results = with_replicates(fake_results(0), 0)
    RecordWriter(tmp_path).write_observation(epoch=2, step=20, results=results, with_covariance=False)
    with np.load(spectra_path(tmp_path, 2), allow_pickle=False) as data:
        assert "cls/covariance" not in data.files  # not a kept epoch: the replicates are written anyway
        names, table, groups = data[JACKKNIFE_METRICS], data["cls/jackknife"], data["cls/jackknife_groups"]
    assert names.dtype.kind == "S" and names.tolist() == [b"effective_rank", b"stable_rank", b"spectral_flatness"]
    assert table.dtype == np.float64 and table.shape == (3, 4)
    assert groups.dtype == np.int64 and groups.tolist() == [4, 4, 3]
    jk = results["cls"].jackknife
    np.testing.assert_array_equal(table[0], jk["effective_rank"])
    np.testing.assert_array_equal(table[2, :3], jk["spectral_flatness"])
    assert np.isnan(table[2, 3])  # padding past the metric's G
    # metrics.csv and every other array are what they would be without replicates
    plain = tmp_path / "plain"
    RecordWriter(plain).write_observation(epoch=2, step=20, results=fake_results(0), with_covariance=False)
    with_stderr = [{**r, "stderr": "nan"} for r in read_csv_rows(tmp_path)]
    assert with_stderr == read_csv_rows(plain)
    with np.load(spectra_path(tmp_path, 2)) as data, np.load(spectra_path(plain, 2)) as before:
        added = set(data.files) - set(before.files)
        assert added == {JACKKNIFE_METRICS} | {f"{p}/{a}" for p in POINTS for a in JACKKNIFE_ARRAYS}
        for key in before.files:
            assert np.array_equal(data[key], before[key]), key


def test_the_rows_follow_the_files_metric_list_whatever_a_point_has(tmp_path):
    """Points and views with other metric sets share the file's list: rows NaN and groups 0 where one has none."""
    from tgo.observatory import ObservationKey

    rng = np.random.default_rng(7)
    res = fake_results(0)
    res["patch_embed"].jackknife = {"effective_rank": rng.normal(size=4), "stable_rank": rng.normal(size=4)}
    res["block_01"].jackknife = {"nc1": rng.normal(size=5), "effective_rank": rng.normal(size=4)}
    res["cls"].jackknife = {}  # no replicates: no arrays
    cls_view = fake_results(1)["cls"]
    cls_view.jackknife = {"ncc_accuracy": np.array([0.5, math.nan, 0.25]), "nc1": np.full(5, math.nan)}
    results = {ObservationKey(p): r for p, r in res.items()} | {ObservationKey("block_01", "cls"): cls_view}
    RecordWriter(tmp_path).write_observation(0, 0, results, with_covariance=False)
    with np.load(spectra_path(tmp_path, 0), allow_pickle=False) as data:
        assert data[JACKKNIFE_METRICS].tolist() == [b"effective_rank", b"stable_rank", b"nc1", b"ncc_accuracy"]
        assert sorted(k for k in data.files if "jackknife" in k) == sorted(
            [JACKKNIFE_METRICS]
            + [f"{p}/{a}" for p in ("patch_embed", "block_01", "block_01/cls") for a in JACKKNIFE_ARRAYS]
        )
        assert data["patch_embed/jackknife_groups"].tolist() == [4, 4, 0, 0]
        assert data["patch_embed/jackknife"].shape == (4, 4) and np.all(np.isnan(data["patch_embed/jackknife"][2:]))
        assert data["block_01/jackknife_groups"].tolist() == [4, 0, 5, 0]
        assert data["block_01/jackknife"].shape == (4, 5)
        assert data["block_01/cls/jackknife_groups"].tolist() == [0, 0, 5, 3]
    got = load_jackknife(tmp_path)
    assert list(got) == ["effective_rank", "stable_rank", "nc1"]
    assert list(got["effective_rank"]) == ["patch_embed", "block_01"] and list(got["stable_rank"]) == ["patch_embed"]
    for metric, per_point in got.items():
        for point, (epochs, replicates) in per_point.items():
            assert epochs.tolist() == [0] and np.array_equal(replicates[0], res[point].jackknife[metric])
    cls = load_jackknife(tmp_path, view="cls")
    assert list(cls) == ["nc1", "ncc_accuracy"] and all(list(p) == ["block_01"] for p in cls.values())
    # a NaN replicate, even a set of them all NaN, is kept as recorded: the groups count tells it from none
    assert np.array_equal(cls["ncc_accuracy"]["block_01"][1][0], [0.5, math.nan, 0.25], equal_nan=True)
    assert cls["nc1"]["block_01"][1].shape == (1, 5) and np.all(np.isnan(cls["nc1"]["block_01"][1]))


def test_replicates_keep_every_float64_bit(tmp_path):
    """Subnormals, signed zeros, infinities and NaN payloads come back as the same 64 bits."""
    bits = np.array([0x0000000000000001, 0x8000000000000000, 0x7FF0000000000000, 0xFFF8000000000000], dtype=np.uint64)
    values = np.concatenate([bits.view(np.float64), [1e-300, -math.pi, 0.1 + 0.2]])
    res = fake_results(0, points=("block_01",))
    res["block_01"].jackknife = {"effective_rank": values}
    RecordWriter(tmp_path).write_observation(0, 0, res, with_covariance=False)
    epochs, replicates = load_jackknife(tmp_path)["effective_rank"]["block_01"]
    assert epochs.tolist() == [0] and replicates.dtype == np.float64
    assert replicates.view(np.uint64).tolist() == [values.view(np.uint64).tolist()]


def test_a_string_array_survives_loading_without_pickle(tmp_path):
    path = tmp_path / "names.npz"
    np.savez(path, names=np.array([b"effective_rank", b"nc1", b"ncc_accuracy"], dtype=np.bytes_))
    with np.load(path, allow_pickle=False) as data:
        names = data["names"]
    assert names.dtype.kind == "S" and names.tolist() == [b"effective_rank", b"nc1", b"ncc_accuracy"]


def test_the_metric_list_is_a_top_level_key_every_reader_skips(tmp_path):
    from tgo.records import load_subspace_history

    results = with_replicates(fake_results(0), 0)
    for r in results.values():
        r.arrays = {"eigenvectors": np.eye(DIM), "components_90": np.asarray(2)}
    RecordWriter(tmp_path).write_observation(0, 0, results, with_covariance=True)
    RecordWriter(tmp_path).write_observation(1, 1, results, with_covariance=False)
    spectra = load_spectra(tmp_path)
    assert list(spectra[0]) == list(POINTS) and JACKKNIFE_METRICS not in spectra[0]
    assert not {JACKKNIFE_METRICS, *JACKKNIFE_ARRAYS} & {a for p in spectra[1].values() for a in p}
    assert load_spectra(tmp_path, arrays=(JACKKNIFE_METRICS,)) == {0: {}, 1: {}}
    init, prev = load_subspace_history(tmp_path, before_epoch=2)
    assert list(init) == list(prev) == list(POINTS)
    assert recorded_epochs(tmp_path) == [0, 1]


def test_metric_names_must_be_ascii(tmp_path):
    res = fake_results(0, points=("block_01",))
    res["block_01"].jackknife = {"rang_effectif_é": np.ones(3)}
    with pytest.raises(ValueError, match="must be ASCII"):
        RecordWriter(tmp_path).write_observation(0, 0, res, with_covariance=False)
    res["block_01"].jackknife = {"nc1\0": np.ones(3)}  # an 'S' array would drop the trailing NUL
    with pytest.raises(ValueError, match=r"without NUL; got \['nc1\\x00'\]"):
        RecordWriter(tmp_path).write_observation(0, 0, res, with_covariance=False)
    assert not spectra_path(tmp_path, 0).exists()


def test_replicates_round_trip_exactly_per_view(tmp_path):
    from tgo.observatory import ObservationKey

    writer = RecordWriter(tmp_path)
    written = {e: with_replicates(fake_results(e), e) for e in (0, 3, 5)}
    other = {e: with_replicates(fake_results(10 + e), 10 + e) for e in written}
    for epoch, res in written.items():
        results = {ObservationKey(p): r for p, r in res.items()}
        results[ObservationKey("block_01", "cls")] = other[epoch]["cls"]
        writer.write_observation(epoch, epoch, results, with_covariance=epoch == 0)
    got = load_jackknife(tmp_path)
    assert list(got) == ["effective_rank", "stable_rank", "spectral_flatness"]
    assert list(got["stable_rank"]) == list(POINTS)
    for metric, per_point in got.items():
        for point, (epochs, replicates) in per_point.items():
            assert epochs.dtype == np.int64 and epochs.tolist() == [0, 3, 5]
            assert replicates.dtype == np.float64 and replicates.shape == (3, 3 if metric == "spectral_flatness" else 4)
            for row, epoch in zip(replicates, epochs, strict=True):
                assert np.array_equal(row, written[int(epoch)][point].jackknife[metric])  # bit-exact
                assert jackknife_stderr(row) == written[int(epoch)][point].stderr[metric]
    cls_view = load_jackknife(tmp_path, view="cls", metrics=["stable_rank"])
    assert list(cls_view) == ["stable_rank"] and list(cls_view["stable_rank"]) == ["block_01"]
    np.testing.assert_array_equal(cls_view["stable_rank"]["block_01"][1][1], other[3]["cls"].jackknife["stable_rank"])
    assert load_jackknife(tmp_path, view="patch") == {}
    # load_spectra leaves the replicates out unless they are named
    assert not set(JACKKNIFE_ARRAYS) & set(load_spectra(tmp_path)[3]["cls"])
    named = load_spectra(tmp_path, [3], arrays=("jackknife_groups",))[3]["cls"]
    assert list(named) == ["jackknife_groups"] and named["jackknife_groups"].tolist() == [4, 4, 3]


def test_old_records_and_points_without_replicates_read_as_none(tmp_path):
    """Old runs: no replicates. Records written before they existed (or without a jackknife) give ``{}``."""
    RecordWriter(tmp_path).write_observation(0, 0, fake_results(0), with_covariance=True)
    with np.load(spectra_path(tmp_path, 0)) as data:
        assert not any("jackknife" in key for key in data.files)
    assert load_jackknife(tmp_path) == {}
    results = fake_results(1)
    results["cls"].jackknife = {}  # a point without replicates writes no jackknife arrays
    results["patch_embed"].jackknife = {"effective_rank": np.empty(0)}  # nor one whose replicates are empty
    results["block_01"] = with_replicates({"block_01": results["block_01"]}, 1)["block_01"]
    RecordWriter(tmp_path).write_observation(1, 1, results, with_covariance=False)
    with np.load(spectra_path(tmp_path, 1)) as data:
        assert [k for k in data.files if "jackknife" in k] == [JACKKNIFE_METRICS] + [
            f"block_01/{a}" for a in JACKKNIFE_ARRAYS
        ]
    got = load_jackknife(tmp_path)
    assert {point for per_point in got.values() for point in per_point} == {"block_01"}
    assert got["effective_rank"]["block_01"][0].tolist() == [1]  # only the epoch that holds them
    with pytest.raises(RecordsError, match="not a directory"):
        load_jackknife(tmp_path / "elsewhere")


def test_a_metric_whose_number_of_replicates_changes_is_refused(tmp_path):
    writer = RecordWriter(tmp_path)
    writer.write_observation(0, 0, with_replicates(fake_results(0), 0, groups=4), with_covariance=False)
    writer.write_observation(1, 1, with_replicates(fake_results(1), 1, groups=5), with_covariance=False)
    with pytest.raises(RecordsError, match=r"epoch_0001\.npz: 5 jackknife replicates of effective_rank"):
        load_jackknife(tmp_path)


def test_damaged_jackknife_arrays_are_refused(tmp_path):
    RecordWriter(tmp_path).write_observation(0, 0, with_replicates(fake_results(0), 0), with_covariance=False)
    path = spectra_path(tmp_path, 0)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}

    def refused(match: str, **changes: np.ndarray | None) -> None:
        damaged = {k: v for k, v in ({**arrays, **changes}).items() if v is not None}
        np.savez(path, **damaged)
        with pytest.raises(RecordsError, match=match):
            load_jackknife(tmp_path)

    point = r"epoch_0000\.npz: the jackknife arrays of point cls, view all are damaged"
    refused(point, **{"cls/jackknife_groups": np.array([4, 9, 3])})  # more replicates than the table holds
    refused(point, **{"cls/jackknife_groups": np.array([4, 4])})  # not one per metric of the file
    refused(point + r" \(jackknife missing", **{"cls/jackknife": None})
    refused(point, **{"cls/jackknife": arrays["cls/jackknife"].astype(np.float32)})
    names = r"epoch_0000\.npz: the jackknife metric names are damaged \(jackknife_metrics "
    refused(names + "missing", **{JACKKNIFE_METRICS: None})
    refused(names + "<U", **{JACKKNIFE_METRICS: np.array(["effective_rank", "stable_rank", "spectral_flatness"])})
    refused(names, **{JACKKNIFE_METRICS: np.array([b"nc1", b"nc1", b"x"])})  # not distinct
    refused(names, **{JACKKNIFE_METRICS: np.array([b"nc1", b"\xff", b"x"])})  # not ASCII
    path.write_bytes(b"not a zip")
    with pytest.raises(RecordsError, match="unreadable"):
        load_jackknife(tmp_path)


# ----------------------------------------------------------------------------------------------------------- layout
def test_run_dir_names_every_file_of_a_run(tmp_path):
    run = RunDir(tmp_path)
    assert run.config == tmp_path / "config.yaml" and run.manifest == tmp_path / "analysis_subset.json"
    assert run.last_checkpoint == tmp_path / "checkpoints" / "last.ckpt"
    assert run.metrics == tmp_path / "geometry" / "metrics.csv"
    assert run.spectra(7) == tmp_path / "geometry" / "spectra" / "epoch_0007.npz"
    assert run.tensorboard == tmp_path / "tensorboard" and run.report == tmp_path / "report"
    assert not run.looks_like_run() and not run.has_records()


def test_the_config_tree_puts_files_where_run_dir_says(compose_cfg):
    """conf/ spells the checkpoint and TensorBoard directories for Hydra; they must agree with RunDir."""
    cfg = compose_cfg()
    run = RunDir(cfg.paths.output_dir)
    assert Path(cfg.callbacks.model_checkpoint.dirpath) == run.checkpoints
    assert (
        Path(cfg.callbacks.last_checkpoint.dirpath) / f"{cfg.callbacks.last_checkpoint.filename}.ckpt"
        == run.last_checkpoint
    )
    assert Path(cfg.logger.tensorboard.save_dir) / cfg.logger.tensorboard.name == run.tensorboard


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX permissions")
def test_atomic_write_respects_the_umask_and_is_durable(tmp_path):
    old = os.umask(0o027)
    try:
        path = atomic_write(tmp_path / "sub" / "file.txt", "text")
    finally:
        os.umask(old)
    assert path.read_text(encoding="utf-8") == "text"
    assert (path.stat().st_mode & 0o777) == 0o640  # 0o666 & ~0o027, not mkstemp's 0o600
    assert atomic_write(tmp_path / "b.bin", b"\x00\x01").read_bytes() == b"\x00\x01"
    assert atomic_write(tmp_path / "c.bin", lambda fh: fh.write(b"xy")).read_bytes() == b"xy"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["b.bin", "c.bin", "file.txt"]


def test_atomic_write_never_writes_through_or_replaces_a_link(tmp_path: Path):
    """Issue 33: ``os.replace`` onto a link a user planted would replace it (a link TGO did not make); a directory
    where a file belongs was a traceback. Both are one line and leave everything as it was."""
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("theirs", encoding="utf-8")
    link = tmp_path / "run" / "config.yaml"
    link.parent.mkdir()
    link.symlink_to(theirs)
    with pytest.raises(RunEnvironmentError, match=r"config.yaml: is a symbolic link .*TGO never writes through"):
        atomic_write(link, "ours")
    assert link.is_symlink() and theirs.read_text(encoding="utf-8") == "theirs"
    folder = tmp_path / "run" / "metrics.csv"
    folder.mkdir()
    with pytest.raises(RunEnvironmentError, match=r"metrics.csv: is a directory; expected a file"):
        atomic_write(folder, "ours")


def test_metric_rows_are_parsed_once_per_version_of_the_file_and_each_caller_gets_its_own(tmp_path, monkeypatch):
    """The story card and the report read metrics.csv once per view: an unchanged file is not parsed again, a rewrite
    (tgo's atomic replace, or an edit in place) is, and rows a caller changes do not change what the next one reads."""
    import tgo.records as records

    writer = RecordWriter(tmp_path)
    writer.write_observation(0, 0, fake_results(0), with_covariance=False)
    parsed = []
    parse = records._parse_metric_rows
    monkeypatch.setattr(records, "_parse_metric_rows", lambda path: parsed.append(path) or parse(path))
    first = records.read_metric_rows(tmp_path)
    assert first == read_csv_rows(tmp_path)
    first[0]["value"] = "changed by a caller"
    assert records.read_metric_rows(tmp_path) == read_csv_rows(tmp_path)
    assert len(parsed) == 1
    writer.write_observation(1, 1, fake_results(1), with_covariance=False)  # an atomic replace
    assert records.read_metric_rows(tmp_path) == read_csv_rows(tmp_path)
    metrics = RunDir(tmp_path).metrics
    text = metrics.read_text(encoding="utf-8")
    last = text.splitlines()[-1]
    assert last.startswith("1,1,")
    metrics.write_text(text + last.replace("1,1,", "2,2,", 1) + "\n", encoding="utf-8")  # same inode
    assert records.read_metric_rows(tmp_path) == read_csv_rows(tmp_path)  # an edit in place: parsed again
    assert len(parsed) == 3
