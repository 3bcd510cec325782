"""The examples run end to end as a user runs them: a subprocess, records on disk, the report on the output; and a
user's own training resumed from any of its checkpoints keeps records that agree with its weights."""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.report.pngs import rasterise_no_figures
from tgo.data import stratified_subset
from tgo.observatory.settings import FigureSettings
from tgo.observatory.standalone import observe_model
from tgo.records import RunDir, load_spectra, read_metric_rows, recorded_epochs
from tgo.report.__main__ import main as report_main
from tgo.resume import SET_ASIDE, ResumeError
from tgo.safe_load import load_weights_only

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_library_example_marks_its_few_tgo_lines() -> None:
    """The lines a user adds to their own training for TGO: two imports, the subset, the callback, the argument."""
    lines = (EXAMPLES / "own_lightning.py").read_text(encoding="utf-8").splitlines()
    tgo_lines = [line.strip() for line in lines if line.rstrip().endswith("# TGO")]
    assert len(tgo_lines) == 5, tgo_lines
    assert not any(line.startswith(("import hydra", "from hydra")) for line in lines), "no Hydra"


@pytest.mark.slow
def test_own_lightning_example_records_and_the_report_reads_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "own_lightning"
    subprocess.run(
        [sys.executable, str(EXAMPLES / "own_lightning.py"), str(out), "--epochs", "1", "--batches", "4"],  # at 0, 1
        check=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert recorded_epochs(out) == [0, 1]
    manifest = json.loads(RunDir(out).manifest.read_text(encoding="utf-8"))
    assert manifest["size"] == 100 and manifest["num_classes"] == 10 and manifest["per_class"] == 10
    # The report of its output, as `python -m tgo.report OUT --no-correlation` runs it, in this process (the command
    # line's own process is tests/test_packaging.py's and the README's); every section and figure is made, only the
    # PNGs are not rasterised (tests/report/test_build.py checks those of a run's report).
    rasterise_no_figures(monkeypatch)
    assert report_main([str(out), "--no-correlation"]) == 0, capsys.readouterr().err
    assert (RunDir(out).report / "index.html").is_file()
    assert not (tmp_path / "geometry").exists(), "records go to the directory given, not the working directory"


# ------------------------------------------------------------------------------------------- resuming one's own fit
# In-process (the example's own `main`), not a subprocess: four fits of a few batches, each an interpreter's imports.
# Without TensorBoard figures (records, checkpoints and what is set aside are checked here, not figures; the
# subprocess above draws them): they were half of each fit's CPU time.
@pytest.fixture(scope="module")
def own_lightning() -> ModuleType:
    spec = importlib.util.spec_from_file_location("own_lightning_example", EXAMPLES / "own_lightning.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    switches = [f.name for f in fields(FigureSettings) if isinstance(f.default, bool)] + list(FigureSettings().extra)
    no_figures = dict.fromkeys(switches, False)  # every switch, the families' own (`extra`) too
    module.SpectralGeometryCallback = functools.partial(module.SpectralGeometryCallback, figures=no_figures)
    return module


@pytest.fixture(scope="module")
def own_run(own_lightning: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 epochs of 2 batches, a checkpoint after each (``epoch=0-step=2.ckpt``, ``epoch=1-step=4.ckpt``, ``last``),
    observed at epochs 0, 1 and 2."""
    out = tmp_path_factory.mktemp("own") / "run"
    own_lightning.main([str(out), "--epochs", "2", "--batches", "2"])
    assert recorded_epochs(out) == [0, 1, 2]
    return out


def _counts(run_dir: Path) -> dict[int, int]:
    """How often each epoch's row of one (point, view, metric) is recorded."""
    rows = [r for r in read_metric_rows(run_dir) if (r["point"], r["view"], r["metric"]) == ("cls", "all", "n_rows")]
    epochs = [int(r["epoch"]) for r in rows]
    return {e: epochs.count(e) for e in sorted(set(epochs))}


def _tgo_files(run_dir: Path) -> dict[str, bytes]:
    """Every file TGO keeps in a run of one's own: the records, the manifest, the checkpoints."""
    places = [run_dir / RunDir.GEOMETRY, run_dir / "checkpoints", run_dir / RunDir.MANIFEST]
    files = [p for place in places for p in ([place] if place.is_file() else place.rglob("*")) if p.is_file()]
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in files}


@pytest.mark.slow
def test_resuming_ones_own_training_from_an_earlier_checkpoint_observes_the_retrained_epochs_again(
    own_lightning: ModuleType, own_run: Path, tmp_path: Path
) -> None:
    """Issue 33, finding 3: ``trainer.fit(..., ckpt_path=<the first epoch's checkpoint>)`` with another number of
    batches per epoch. Lightning retrains epoch 2; its old records are set aside with the reason, the epoch observed
    again, and the last record is what the latest checkpoint's weights give, recomputed here."""
    out = tmp_path / "run"
    shutil.copytree(own_run, out)
    before = read_metric_rows(out)
    first = out / "checkpoints" / "epoch=0-step=2.ckpt"  # Lightning's epoch 0: the weights the records call epoch 1
    own_lightning.main([str(out), "--epochs", "2", "--batches", "3", "--ckpt-path", str(first)])

    assert _counts(out) == {0: 1, 1: 1, 2: 1}
    rows = read_metric_rows(out)
    assert [r for r in rows if r["epoch"] in {"0", "1"}] == [r for r in before if r["epoch"] in {"0", "1"}]
    assert {r["step"] for r in before if r["epoch"] == "2"} == {"4"}
    assert {r["step"] for r in rows if r["epoch"] == "2"} == {"5"}, "2 steps, then 3 of the resumed training"
    (aside,) = (out / SET_ASIDE).iterdir()
    assert "recorded after epoch=0-step=2.ckpt was saved" in (aside / "REASON.txt").read_text(encoding="utf-8")
    assert read_metric_rows(aside) == [r for r in before if r["epoch"] == "2"], "moved, not lost"
    assert [p.name for p in (aside / "geometry" / "spectra").iterdir()] == ["epoch_0002.npz"]

    latest = load_weights_only(out / "checkpoints" / "last.ckpt")
    assert latest["global_step"] == 5
    model = own_lightning.DigitsClassifier()
    model.load_state_dict(latest["state_dict"])
    _, val_set = own_lightning.digits()
    again = observe_model(model.backbone, stratified_subset(val_set, per_class=10, seed=0))
    recorded = load_spectra(out, epochs=[2])[2]
    assert set(recorded) == {key.point for key in again if key.view == "all"}
    for key, result in again.items():
        if key.view == "all":
            values = np.asarray(result.spectrum.eigenvalues)
            np.testing.assert_allclose(recorded[key.point]["eigenvalues"], values, rtol=1e-10, atol=1e-10 * values[0])


@pytest.mark.slow
def test_ones_own_training_refuses_another_trainings_checkpoint_before_moving_anything(
    own_lightning: ModuleType, own_run: Path, tmp_path: Path
) -> None:
    """Issue 33, finding 6: ``ckpt_path=<another run's checkpoint>`` appended an epoch trained from the other run's
    weights without a word. The run id in the checkpoint differs from the records': one line, nothing moved."""
    out, other = tmp_path / "run", tmp_path / "other"
    shutil.copytree(own_run, out)
    own_lightning.main([str(other), "--epochs", "1", "--batches", "1"])  # another training, same model
    kept = _tgo_files(out)
    with pytest.raises(ResumeError) as refused:
        own_lightning.main(
            [str(out), "--epochs", "2", "--batches", "2", "--ckpt-path", str(other / "checkpoints" / "last.ckpt")]
        )
    message = str(refused.value)
    assert "\n" not in message and "weights of another training" in message and "nothing was moved" in message
    assert str(other / "checkpoints" / "last.ckpt") in message and str(out) in message
    assert _tgo_files(out) == kept and not (out / SET_ASIDE).exists()
