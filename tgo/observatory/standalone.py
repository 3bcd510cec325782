"""``tgo.observe_model``: one observation of a model in plain PyTorch, without Lightning, Hydra or a DataModule.

The same code path as the training callback and ``python -m tgo.observe`` in one process, so its numbers equal theirs
bit for bit for the same weights, data and settings::

    analysis = tgo.data.stratified_subset(val_set, per_class=10, seed=0)
    for epoch in range(epochs + 1):
        if epoch % 5 == 0 or epoch == epochs:
            tgo.observe_model(model, analysis, out="runs/mine", epoch=epoch, step=steps_done)
        ...  # train one epoch; then: python -m tgo.report runs/mine

`claim_run_directory` is the rule this and ``SpectralGeometryCallback(analysis=...)`` follow in a directory that is not
a ``tgo.train`` run: TGO writes only its own files and never mixes the records of two analysis sets or trainings."""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tgo.errors import UserInputError
from tgo.observatory.families import registered_families
from tgo.observatory.find_vit import ModelSpec, require_vit, resolve_network
from tgo.observatory.pipeline import RecordPlan, ShardPlan, observe_and_record
from tgo.observatory.points import points_from_config, resolve_points
from tgo.observatory.results import Results
from tgo.observatory.settings import ObservationSettings
from tgo.records import RecordsError, RecordWriter, RunDir, atomic_write_json, read_metric_rows, recorded_epochs
from tgo.resume import RUN_ID_FILE
from tgo.run_description import description_problem, observation_description, write_description
from tgo.run_lock import RunLock
from tgo.spectral.eigensolver import resolve_eigvalsh

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "RunDirectoryError",
    "claim_run_directory",
    "observation_settings",
    "observe_model",
    "prepare_analysis",
    "vit_network",
]

DEFAULT_BATCH_SIZE = 64  # images per forward pass when neither the settings nor a DataLoader say


class RunDirectoryError(UserInputError):
    """A directory TGO would record into holds files it did not make, or records that must not be mixed (one line)."""


# ----------------------------------------------------------------------------------------------------- inputs
def observation_settings(
    settings: ObservationSettings | Mapping[str, Any] | None, overrides: Mapping[str, Any]
) -> ObservationSettings:
    """``settings`` with keyword overrides, validated as the config path validates them."""
    base = ObservationSettings.from_config(settings)
    return base.replace(**overrides) if overrides else base


def vit_network(container: nn.Module, model: ModelSpec, settings: ObservationSettings, *, what: str) -> nn.Module:
    """The network to observe, refused in one line if the ``vit`` points preset cannot read it."""
    network = resolve_network(container, model, what=what)
    if (settings.points or {}).get("preset") == "vit":
        if model is None:
            described = f"the network found in {what}"
        elif isinstance(model, str):
            described = f"model={model!r}"
        else:
            described = f"the network model={getattr(model, '__name__', 'callable')} returned"
        require_vit(network, described)
    return network


def prepare_analysis(analysis: Any, *, where: str) -> tuple[Any, int | None, int | None, str | None]:
    """``(checked dataset with .labels, loader batch size, loader workers, stratification warning or None)``."""
    from tgo.data.subsets import analysis_input, check_analysis_set, stratification_notice

    dataset, batch_size, num_workers = analysis_input(analysis)
    checked = check_analysis_set(dataset, where=where)
    return checked, batch_size, num_workers, stratification_notice(checked.labels)


# ----------------------------------------------------------------------------------------------------- run directory
def _describe(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def _foreign_in_geometry(run: RunDir) -> list[str]:
    """What ``geometry/`` (and its step series) holds that TGO's records never are; empty when it is TGO's own."""
    here = run.geometry.relative_to(run.root).as_posix()
    if not run.geometry.exists():
        return []
    if not run.geometry.is_dir():
        return [here]
    foreign = []
    folders = {family.folder: family for family in registered_families() if family.folder}
    for entry in sorted(run.geometry.iterdir()):
        if entry.name == run.METRICS and entry.is_file():
            try:
                read_metric_rows(run)
            except RecordsError:
                foreign.append(f"{here}/{entry.name}")
        elif entry.name == run.SPECTRA and entry.is_dir():
            own = set(run.spectra_files().values())
            foreign += [f"{here}/{run.SPECTRA}/{p.name}" for p in sorted(entry.iterdir()) if p not in own]
        elif entry.name in folders and entry.is_dir():  # a family's own files (`MeasurementFamily.folder`)
            own = set(folders[entry.name].kept_files(run))
            foreign += [
                f"{here}/{entry.name}/{p.name}"
                for p in sorted(entry.iterdir())
                if p not in own and not (p.name.startswith(".") and p.name.endswith(".tmp"))
            ]
        elif entry.name == run.STEPS and entry.is_dir() and run.series == "epoch":  # the step series
            foreign += _foreign_in_geometry(run.step_series)
        elif entry.name == RUN_ID_FILE and entry.is_file() and run.series == "epoch":  # the run id (tgo.resume)
            continue
        elif not (entry.name.startswith(".") and entry.name.endswith(".tmp")):  # atomic_write's leftovers
            foreign.append(f"{here}/{entry.name}")
    return foreign


def _manifest_of(path: Path) -> dict[str, Any] | None:
    """The analysis manifest at ``path`` if TGO wrote it (a JSON object with a version and a fingerprint)."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(manifest, dict) and "version" in manifest and isinstance(manifest.get("fingerprint"), str):
        return manifest
    return None


def claim_run_directory(
    root: str | Path, *, manifest: Mapping[str, Any] | None, fresh: bool, what: str = "the run directory"
) -> None:
    """Checks that TGO may record into ``root`` (not marked as a run by ``tgo.train``) and writes its manifest.

    TGO's files there are ``geometry/``, ``analysis_subset.json`` and ``run_description.json``; anything else is the
    user's, never touched.
    Refused, in one line: a link where TGO writes or a file where it keeps a directory; a ``geometry/`` holding anything
    but TGO's records; with ``fresh`` (a training from scratch) records already there; an ``analysis_subset.json`` TGO
    did not write, or one of another analysis set while records exist (the records would mix two subsets)."""
    run = RunDir(root)
    if run.root.exists() and not run.root.is_dir():
        raise RunDirectoryError(f"{what} '{run.root}' is a file; expected a directory for the geometry records")
    unsafe = run.unsafe_entry() if run.root.is_dir() else None
    if unsafe is not None:
        raise RunDirectoryError(
            f"{what} '{run.root}': {unsafe}; TGO never writes through a link nor replaces what it did not make: "
            "choose another directory"
        )
    problem = description_problem(run.root)  # run_description.json: TGO's own, or refused
    if problem is not None:
        raise RunDirectoryError(f"{what}: {problem}")
    foreign = _foreign_in_geometry(run)
    if foreign:
        raise RunDirectoryError(
            f"{what} '{run.root}': {run.GEOMETRY}/ holds files TGO did not make ({_describe(foreign)}); TGO records "
            f"into {run.GEOMETRY}/ and never overwrites a file it did not create: choose another directory"
        )
    has_records = run.has_records() or run.step_series.has_records()
    if fresh and has_records:
        epochs = recorded_epochs(run.root)
        raise RunDirectoryError(
            f"{what} '{run.root}' already holds the geometry records of another training (epochs {epochs}); choose a "
            "new directory (trainer default_root_dir), or resume that training with trainer.fit(..., ckpt_path=...)"
        )
    if manifest is None:
        return
    if run.manifest.exists():
        existing = _manifest_of(run.manifest)
        if existing is None:
            raise RunDirectoryError(
                f"{what} '{run.root}' holds an {run.MANIFEST} TGO did not write; choose another directory (TGO "
                "never overwrites a file it did not create)"
            )
        if existing.get("fingerprint") == manifest.get("fingerprint"):
            return
        if has_records:
            raise RunDirectoryError(
                f"{what} '{run.root}' holds records of another analysis set ({run.MANIFEST} fingerprint "
                f"{str(existing.get('fingerprint'))[:12]}..., this one {str(manifest.get('fingerprint'))[:12]}...); "
                "the geometry of two subsets must not mix: choose another directory or the same analysis set"
            )
    run.root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run.manifest, dict(manifest))


# ----------------------------------------------------------------------------------------------------- observe
class _NoRecords(RecordWriter):
    """A writer that writes nothing (``observe_model`` without ``out``); its empty directory has no history."""

    def write_observation(self, epoch: int, step: int, results: Mapping[Any, Any], *, with_covariance: bool) -> None:
        return None


def observe_model(
    model: nn.Module,
    dataset: Any,
    *,
    out: str | Path | None = None,
    epoch: int = 0,
    step: int = 0,
    settings: ObservationSettings | Mapping[str, Any] | None = None,
    device: torch.device | str | None = None,
    **setting_overrides: Any,
) -> Results:
    """Observes the spectral geometry of ``model`` on ``dataset`` once, in this process.

    Args:
        model: A timm ViT, or a module holding exactly one (wrappers looked through); its training flags are restored.
        dataset: A map-style ``Dataset`` of ``(image tensor, int label)`` (ideally `tgo.data.stratified_subset`), or a
            ``DataLoader`` over one (its batch size and workers are used).
        out: A directory to record into as the callback does, successive epochs building a trajectory; an epoch already
            recorded there is refused, never overwritten. ``None``: nothing is written.
        epoch, step: Completed epochs and optimiser steps of these weights.
        settings, **setting_overrides: `ObservationSettings` or a mapping of its keys, then any key overridden.
        device: Where the pass runs (default: the model's).

    Returns ``{ObservationKey(point, view): PointResult}`` in depth order (``results["cls"]`` is point ``cls``'s ``all``
    view); every bad input raises a one-line `tgo.errors.UserInputError`."""
    from tgo.data.subsets import analysis_manifest

    settings = observation_settings(settings, setting_overrides)
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise UserInputError(f"observe_model: epoch must be an integer >= 0; got {epoch!r}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UserInputError(f"observe_model: step must be an integer >= 0; got {step!r}")
    network = vit_network(model, None, settings, what="the model")
    points = points_from_config(settings.points, network)
    resolve_points(network, points)
    analysis, batch_size, num_workers, notice = prepare_analysis(dataset, where="observe_model(dataset)")
    if notice:
        warnings.warn(notice, UserWarning, stacklevel=2)
    plan = ShardPlan.for_rank(
        settings,
        rank=0,
        world_size=1,
        default_batch_size=batch_size or DEFAULT_BATCH_SIZE,
        default_num_workers=num_workers or 0,
    )
    if device is None:
        device = next((p.device for p in network.parameters()), torch.device("cpu"))

    def observe(writer: RecordWriter, keep: bool) -> Results:
        results = observe_and_record(
            network,
            analysis,
            points,
            settings=settings,
            plan=plan,
            record=RecordPlan(writer=writer, epoch=epoch, step=step, with_covariance=keep),
            all_reduce_sum=lambda t: t,
            is_global_zero=True,
            device=device,
            eigvalsh=resolve_eigvalsh(settings.summary.eigensolver, device),
        )
        assert results is not None  # one process is rank 0
        return results

    if out is None:
        with tempfile.TemporaryDirectory(prefix="tgo-observe-model-") as empty:
            return observe(_NoRecords(empty), keep=True)
    run = RunDir(out)
    recorded = recorded_epochs(run.root) if run.has_records() and not _foreign_in_geometry(run) else []
    if epoch in recorded:
        raise RunDirectoryError(
            f"observe_model: epoch {epoch} is already recorded in '{run.root}' (recorded: {recorded}); TGO never "
            "overwrites an observation: give the next epoch, or another out"
        )
    manifest = analysis_manifest(analysis, written_by="tgo.observe_model", groups=settings.groups)
    with RunLock(run.root, what="observe_model(out=...)"):  # one process writes out at a time (tgo.run_lock)
        claim_run_directory(run.root, manifest=manifest, fresh=False, what="observe_model(out=...)")
        first = not recorded or epoch < min(recorded)
        results = observe(RecordWriter(run), keep=settings.keeps_covariance(epoch, first=first, last=False))
        write_description(run.root, observation_description(network, analysis, epoch=epoch, step=step))
        return results
