"""``python -m tgo.observe``: the geometry callback's observation, applied to models that already exist.

It runs the callback's own code path (`tgo.observatory.observe_and_record`), so its records are a training run's. A
model from a run uses the run's data, pinned analysis subset and observation settings (overrides on top), which is
what makes a re-observation reproduce the callback's records exactly.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, cast

import torch
from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from hydra.utils import instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tgo.checkpoints import (
    CheckpointMismatchError,
    ModelSource,
    check_weights_file,
    checkpoint_source,
    find_checkpoints,
    net_from_checkpoint,
    net_from_user_checkpoint,
    timm_net,
)
from tgo.config import CONFIG_MODULE
from tgo.errors import Stopped, UserInputError, find_user_error, stopped_by_sigterm
from tgo.observatory import (
    ObservationSettings,
    RecordPlan,
    ShardPlan,
    observe_and_record,
    points_from_config,
    resolve_points,
)
from tgo.observatory.share import summary_gather
from tgo.progress import LoopProgress, terminal_progress
from tgo.records import RecordWriter, RunDir, atomic_write, recorded_epochs
from tgo.run_description import observation_description, write_description
from tgo.run_lock import LOCK_NAME, RunLock, RunLockError, launcher_rank
from tgo.spectral.eigensolver import resolve_eigvalsh

__all__ = [
    "CheckpointMismatchError",
    "ObserveError",
    "compose_observe_config",
    "count_text",
    "main",
    "observe_models",
]


class ObserveError(UserInputError):
    """Bad input to ``tgo.observe``: a directory that is not a run, conflicting options, a bad override."""


# ----------------------------------------------------------------------------------------------------- config
def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def compose_observe_config(overrides: Sequence[str] = (), run_dir: Path | None = None) -> DictConfig:
    """Composes ``conf/observe.yaml`` with overrides; with ``run_dir`` the run's data (its subset pinned) and
    observation settings win, ``data.*`` and ``observation.*`` overrides on top (``data=<group>`` replaces the run's
    data)."""
    overrides = list(overrides)
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            cfg = compose("observe", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ObserveError(f"bad override ({err})") from err
    OmegaConf.set_struct(cfg, False)  # the run's settings and the record of the source are merged in below
    if run_dir is None:
        return cfg
    run = RunDir(run_dir)
    run_cfg = OmegaConf.load(run.config)
    keys = [_override_key(o) for o in overrides]
    dotlist = [o.lstrip("+") for o in overrides if "=" in o]
    if "data" not in keys and "data" in run_cfg:
        data = OmegaConf.merge(
            run_cfg.data, OmegaConf.from_dotlist([d[len("data.") :] for d in dotlist if d.startswith("data.")])
        )
        if "data.analysis.manifest" not in keys and run.manifest.is_file():
            OmegaConf.update(data, "analysis.manifest", str(run.manifest), force_add=True)
        cfg.data = data
    from_run = run_cfg.observation if "observation" in run_cfg else _legacy_observation(run_cfg)
    if from_run is not None:
        user = OmegaConf.from_dotlist([d[len("observation.") :] for d in dotlist if d.startswith("observation.")])
        cfg.observation = OmegaConf.merge(cfg.observation, from_run, user)
    return cfg


def _legacy_observation(run_cfg: DictConfig | ListConfig) -> dict[str, Any] | None:
    """Observation settings of a run older than the ``observation`` group (they lived in the callback)."""
    callback = OmegaConf.select(run_cfg, "callbacks.spectral_geometry")
    if callback is None:
        return None
    old = OmegaConf.to_container(callback, resolve=False)
    assert isinstance(old, dict)
    known = {f.name for f in fields(ObservationSettings)}
    settings = {str(k): v for k, v in old.items() if k in known}
    if old.get("covariance_epochs") is not None:
        settings["keep_covariance"] = list(old["covariance_epochs"])
    return settings


def _run_dir_of(checkpoint_dir: Path) -> Path | None:
    """The run a checkpoints directory belongs to (its parent holding config.yaml), if any."""
    parent = checkpoint_dir.resolve().parent
    return parent if RunDir(parent).config.is_file() else None


# ----------------------------------------------------------------------------------------------------- observe
def count_text(results: Mapping[Any, Any]) -> str:
    """``15 points, 71 (point, view) records``: what one observation's results hold."""
    points = {getattr(key, "point", key) for key in results}
    return f"{len(points)} point{'s' if len(points) != 1 else ''}, {len(results)} (point, view) records"


def _check_out(out: Path) -> None:
    """Refuses, before any work, an ``--out`` that is not new, empty or a TGO run without records."""
    if out.exists() and not out.is_dir():
        raise ObserveError(f"--out {out}: exists and is not a directory")
    if not out.is_dir():
        return
    # another process writes there now: named, before any work (Fabric's other ranks run beside rank 0's lock)
    held = RunLock(out, what="--out").refusal() if launcher_rank() == 0 else None
    if held is not None:
        raise RunLockError(held)
    run = RunDir(out)
    unsafe = run.unsafe_entry()
    if unsafe is not None:
        raise ObserveError(
            f"--out {out}: {unsafe}; TGO never writes through a link nor replaces what it did not make: choose "
            "another directory"
        )
    entries = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME)
    if entries and not (run.is_marked() or run.manifest.is_file()):
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        copied = " (its .tgo-run was made for another directory)" if run.read_marker() is not None else ""
        raise ObserveError(
            f"--out {out}: holds files TGO did not make ({shown}) and is not a TGO run{copied}; expected a new or "
            "empty directory (tgo.observe would overwrite its config.yaml): choose another directory"
        )
    geometry = run.geometry
    if geometry.exists() and any(geometry.iterdir()):
        raise ObserveError(
            f"--out {out}: already holds geometry records; choose a new directory (records of "
            "different models must not mix)"
        )


def _sources(
    checkpoint: str | None, checkpoints: str | None, run: str | None, timm_name: str | None, epoch: int
) -> tuple[list[ModelSource], Path | None]:
    given = [x for x in (checkpoint, checkpoints, run) if x is not None]
    if len(given) > 1 or (not given and timm_name is None):
        raise ObserveError(
            "give exactly one model source: --checkpoint FILE, --checkpoints DIR, --run RUN_DIR or --timm NAME "
            "(--timm NAME with --checkpoint or --checkpoints: a checkpoint of your own LightningModule)"
        )
    if run is not None and timm_name is not None:
        raise ObserveError(
            "--run reads a TGO run, whose checkpoints name their model; --timm NAME goes with --checkpoint FILE or "
            "--checkpoints DIR of your own LightningModule"
        )
    if checkpoint is not None:
        path = Path(checkpoint)
        return [checkpoint_source(path)], _run_dir_of(path.parent)
    if run is not None:
        run_path = Path(run)
        if not RunDir(run_path).checkpoints.is_dir():
            raise ObserveError(
                f"--run {run_path}: not a run directory with checkpoints/ (expected {RunDir(run_path).checkpoints})"
            )
        checkpoints = str(RunDir(run_path).checkpoints)
    if checkpoints is not None:
        directory = Path(checkpoints)
        return find_checkpoints(directory), _run_dir_of(directory)
    return [ModelSource("timm", None, int(epoch), 0)], None


def _iter_nets(
    sources: Sequence[ModelSource],
    *,
    timm_name: str | None,
    pretrained: bool,
    weights: Path | None,
    seed: int,
    img_size: int,
    in_chans: int,
    arch: dict[str, Any],
    prefix: str | None = None,
    prefixes: dict[Path, str] | None = None,
) -> Iterator[tuple[ModelSource, torch.nn.Module]]:
    """Loads one model at a time, so a trajectory of large checkpoints never holds two in memory."""
    for source in sources:
        if source.kind == "checkpoint" and timm_name is not None:
            assert source.path is not None
            net, used = net_from_user_checkpoint(
                source.path, timm_name, prefix=prefix, img_size=img_size, in_chans=in_chans, arch=arch
            )
            if prefixes is not None:
                prefixes[source.path] = used
            yield source, net
        elif source.kind == "checkpoint":
            assert source.path is not None
            yield source, net_from_checkpoint(source.path)
        else:
            assert timm_name is not None
            yield (
                source,
                timm_net(
                    timm_name,
                    pretrained=pretrained,
                    weights=weights,
                    seed=seed,
                    img_size=img_size,
                    in_chans=in_chans,
                    arch=arch,
                ),
            )


def _check_fits_data(net: torch.nn.Module, datamodule: Any, source: ModelSource) -> None:
    patch = getattr(net, "patch_embed", None)
    img_size = getattr(patch, "img_size", None)
    if img_size is not None and tuple(img_size) != (datamodule.image_size, datamodule.image_size):
        raise ObserveError(
            f"{source.path or 'the model'} expects {tuple(img_size)} images but the data gives "
            f"{datamodule.image_size} px; set data.image_size={img_size[0]}"
        )
    proj = getattr(patch, "proj", None)
    if proj is not None and getattr(proj, "in_channels", datamodule.in_chans) != datamodule.in_chans:
        raise ObserveError(
            f"{source.path or 'the model'} expects {proj.in_channels} input channels but the data "
            f"gives {datamodule.in_chans}"
        )


def observe_models(
    *,
    out: str | Path,
    checkpoint: str | None = None,
    checkpoints: str | None = None,
    run: str | None = None,
    timm_name: str | None = None,
    pretrained: bool = False,
    weights: str | None = None,
    seed: int = 0,
    epoch: int = 0,
    overrides: Sequence[str] = (),
    prefix: str | None = None,
) -> list[ModelSource]:
    """Observes one model or a checkpoint trajectory (the CLI's sources, ``--help``) and writes training-compatible
    records to ``out``; returns the observed sources in epoch order."""
    import lightning as L

    out = Path(out)
    user_checkpoints = timm_name is not None and (checkpoint is not None or checkpoints is not None)
    if (timm_name is None or user_checkpoints) and (pretrained or weights is not None):
        raise ObserveError("--pretrained and --weights only apply to --timm NAME without a checkpoint")
    if prefix is not None and not user_checkpoints:
        raise ObserveError(
            "--prefix only applies to a checkpoint of your own LightningModule: --checkpoint FILE --timm NAME"
        )
    if weights is not None:
        check_weights_file(Path(weights))  # a refused or unreadable file stops here, before the data is read
    sources, run_dir = _sources(checkpoint, checkpoints, run, timm_name, epoch)
    if run_dir is None and sources[0].kind == "checkpoint" and "data" not in map(_override_key, overrides):
        raise ObserveError(  # conf/observe.yaml's default data (TGO's digits) would be observed silently
            f"{checkpoint or checkpoints or run}: not in a TGO run (no config.yaml beside its checkpoints/), so its "
            "data is unknown: name it, e.g. data=imagefolder data.root=DIR (data=digits: TGO's bundled digits)"
        )
    cfg = compose_observe_config(overrides, run_dir)
    settings = ObservationSettings.from_config(cfg.observation)
    _check_out(out)
    # One process per output directory: the launching process (rank 0 of Fabric's re-launch) holds the lock until the
    # last record is written, an error included; it makes --out, and removes it again if nothing was written.
    lock = RunLock(out, what="--out") if launcher_rank() == 0 else None
    if lock is not None:
        lock.acquire()
    try:
        _check_out(out)  # again under the lock: another process may have written there since
        return _observe(L, out, cfg, settings, sources, run_dir, timm_name, pretrained, weights, seed, prefix)
    finally:
        if lock is not None:
            lock.release()


def _observe(
    L: Any,
    out: Path,
    cfg: DictConfig,
    settings: ObservationSettings,
    sources: list[ModelSource],
    run_dir: Path | None,
    timm_name: str | None,
    pretrained: bool,
    weights: str | None,
    seed: int,
    prefix: str | None,
) -> list[ModelSource]:
    """`observe_models` after its input is checked and ``out`` locked."""
    fabric = L.Fabric(
        accelerator=cfg.fabric.accelerator,
        devices=cfg.fabric.devices,
        num_nodes=cfg.fabric.num_nodes,
        strategy=cfg.fabric.strategy,
        precision="32-true",
    )
    fabric.launch()
    datamodule = instantiate(cfg.data).validate()
    writer = RecordWriter(out)
    fabric.barrier("tgo_observe_setup")  # every rank has checked its input before rank 0 writes anything
    if fabric.is_global_zero:
        out.mkdir(parents=True, exist_ok=True)
        RunDir(out).mark("observe")
        datamodule.write_manifest(out, jackknife_groups=settings.groups)
        # kind, path, epoch, step: the source's fields in their order, the path resolved
        described = [{**asdict(s), "path": None if s.path is None else str(s.path.resolve())} for s in sources]
        saved = OmegaConf.merge(
            cfg,
            {
                "source": {
                    "run": None if run_dir is None else str(run_dir),
                    "timm": timm_name,
                    "pretrained": pretrained,
                    "weights": weights,
                    "prefix": prefix,
                    "seed": seed,
                    "models": described,
                }
            },
        )
        atomic_write(RunDir(out).config, OmegaConf.to_yaml(saved, resolve=True))

    plan = ShardPlan.for_rank(
        settings,
        rank=fabric.global_rank,
        world_size=fabric.world_size,
        default_batch_size=datamodule.analysis_batch_size,
        default_num_workers=datamodule.num_workers,
    )
    arch_cfg = OmegaConf.to_container(cfg.model.arch, resolve=True) or {}
    assert isinstance(arch_cfg, dict)
    arch = {str(k): v for k, v in arch_cfg.items() if v is not None}
    prefixes: dict[Path, str] = {}
    gather = summary_gather(fabric.world_size, settings.summary.share)  # every rank: makes TGO's gloo group
    eigvalsh = resolve_eigvalsh(settings.summary.eigensolver, fabric.device)
    nets = _iter_nets(
        sources,
        timm_name=timm_name,
        pretrained=pretrained,
        weights=None if weights is None else Path(weights),
        seed=seed,
        img_size=datamodule.image_size,
        in_chans=datamodule.in_chans,
        arch=arch,
        prefix=prefix,
        prefixes=prefixes,
    )
    for index, (source, net) in enumerate(nets):
        _check_fits_data(net, datamodule, source)
        points = points_from_config(settings.points, net)
        resolve_points(net, points)
        net.to(fabric.device)
        keep = settings.keeps_covariance(source.epoch, first=index == 0, last=index == len(sources) - 1)
        record = RecordPlan(writer=writer, epoch=source.epoch, step=source.step, with_covariance=keep)
        label = source.path.name if source.path is not None else str(timm_name)
        # rank 0's batches as a bar on a terminal's stderr (a log file gets the line below only)
        what = f"observing {label}"
        with terminal_progress(what) if fabric.is_global_zero else LoopProgress(what) as progress:
            results = observe_and_record(
                net,
                datamodule.analysis_dataset,
                points,
                settings=settings,
                plan=plan,
                record=record,
                all_reduce_sum=lambda t: cast(torch.Tensor, fabric.all_reduce(t, reduce_op="sum")),
                is_global_zero=fabric.is_global_zero,
                device=fabric.device,
                gather=gather,
                eigvalsh=eigvalsh,
                progress=progress,
            )
        if results is not None:
            if source.path in prefixes:
                label += f" ({timm_name}, weights under {prefixes[source.path]!r})"
            print(f"[tgo] observed {label} as epoch {source.epoch} ({count_text(results)})", file=sys.stderr)
            description = observation_description(
                net, datamodule.analysis_dataset, epoch=source.epoch, step=source.step, entry="tgo.observe"
            )
            write_description(out, description)  # run_description.json: parameters and versions beside config.yaml
        del net
    fabric.barrier("tgo_observe_done")
    return sources


# ----------------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``python -m tgo.observe`` arguments (see ``--help``)."""
    parser = argparse.ArgumentParser(
        prog=None if Path(sys.argv[0]).name.startswith("tgo-") else "python -m tgo.observe",  # console script: its name
        description="Observe the spectral geometry of existing models with the training callback's code path; "
        "writes records that `python -m tgo.report` reads.",
        epilog="Trailing KEY=VALUE arguments are Hydra overrides of conf/observe.yaml, e.g. data=synthetic "
        "data.image_size=32 observation.gram_dtype=float32 fabric.accelerator=gpu fabric.devices=2 "
        "fabric.strategy=ddp model.arch.depth=4",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--checkpoint",
        help="a Lightning checkpoint of tgo.model.ViTClassifier; with --timm NAME, of your own LightningModule; "
        "outside a TGO run, name its data (data=GROUP)",
    )
    source.add_argument(
        "--checkpoints", help="a directory of checkpoints (every *.ckpt, in epoch order); also with --timm NAME"
    )
    source.add_argument("--run", help="a run directory (observes its checkpoints/)")
    parser.add_argument(
        "--timm",
        dest="timm_name",
        metavar="NAME",
        help="a timm model name: observed alone, or the model inside --checkpoint/--checkpoints of your own "
        "LightningModule (its arguments as model.arch.* overrides)",
    )
    parser.add_argument(
        "--prefix",
        help="with --checkpoint FILE --timm NAME: where the ViT's weights live in the state dict, e.g. backbone. for "
        "self.backbone ('' for none); default: the one prefix holding exactly the model's keys",
    )
    parser.add_argument("--pretrained", action="store_true", help="with --timm: load pretrained weights (hub)")
    parser.add_argument("--weights", help="with --timm: a local weights file (.safetensors or torch state dict)")
    parser.add_argument("--seed", type=int, default=0, help="with --timm: seed of the random initialisation")
    parser.add_argument("--epoch", type=int, default=0, help="with --timm: epoch label of the observation")
    parser.add_argument("--out", required=True, help="output directory for the records (must not hold records)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides of conf/observe.yaml")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI: 0, 2 after one line for bad input, or ``128 + signum`` when SIGTERM stops it."""
    args = parse_args(argv)
    try:
        with stopped_by_sigterm():
            return _main(args)
    except Stopped as stop:
        if getattr(rank_zero_only, "rank", 0) == 0:
            epochs = recorded_epochs(args.out) if Path(args.out).is_dir() else []
            kept = f"the records of epochs {epochs} in {args.out} are whole" if epochs else "nothing was recorded"
            print(
                f"tgo.observe: stopped by {stop.name}: {kept}; the other models were not "
                "observed (observe them into a new --out)",
                file=sys.stderr,
            )
        return 128 + stop.signum


def _main(args: argparse.Namespace) -> int:
    try:
        sources = observe_models(**vars(args))  # every option's dest is one of its parameters
    except Exception as error:
        user_error = find_user_error(error)  # Hydra's instantiate wraps the DataModule's own errors
        if user_error is None:
            raise
        print(f"tgo.observe: error: {user_error}", file=sys.stderr)
        return 2
    if getattr(rank_zero_only, "rank", 0) != 0:  # set by Fabric's launch; other ranks stay quiet
        return 0
    epochs = ", ".join(str(s.epoch) for s in sources)
    print(f"[tgo] records of epoch(s) {epochs} in {Path(args.out).resolve()}; report: python -m tgo.report {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
