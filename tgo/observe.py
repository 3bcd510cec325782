"""``python -m tgo.observe``: the geometry callback's observation, applied to models that already exist.

It runs exactly the callback's code path (`tgo.observatory.sharded.observe_and_record`), so the records it writes
(``<out>/geometry/``, ``<out>/analysis_subset.json``, ``<out>/config.yaml``) are the records a training run writes
and ``python -m tgo.report <out>`` works on them. Models come from one of::

    --checkpoint FILE        a Lightning checkpoint of tgo.model.ViTClassifier
    --checkpoints DIR        every *.ckpt of a run's checkpoints/ directory, in epoch order (a trajectory)
    --run RUN_DIR            the same as --checkpoints RUN_DIR/checkpoints
    --timm NAME              a timm model: random init (--seed), --weights FILE, or --pretrained (needs a hub)

Data and observation settings come from ``conf/observe.yaml`` composed with Hydra's compose API, so any group of
the config tree can be chosen with trailing overrides (``data=synthetic data.image_size=32``). When the model
comes from a run (a checkpoint inside ``<run>/checkpoints/``), the run's own ``config.yaml`` data node, its pinned
analysis subset (``analysis_subset.json``) and its callback's observation settings are used instead, and
``data.*`` / ``observation.*`` overrides are applied on top. That is what makes a re-observation reproduce the
callback's records exactly.

Epoch labels: a checkpoint is labelled with the training epochs it had completed, which is Lightning's
``loops.fit_loop.epoch_progress.current.processed`` (``checkpoint["epoch"] + 1`` for a checkpoint saved at an
epoch end, as ``last.ckpt`` and ``best_epoch_*.ckpt`` are; the callback labels its observation of the same weights
the same way). Older checkpoints without loop state fall back to ``checkpoint["epoch"] + 1``. A checkpoint saved in
the middle of an epoch is labelled with the epochs completed before it, with a warning. A timm model is labelled
``--epoch`` (default 0).

Devices: the pass runs inside a Lightning Fabric (``fabric.accelerator``, ``fabric.devices``, ``fabric.strategy``),
each process observing a disjoint shard of the analysis subset, reduced with one sum all-reduce, as in training.
Rank 0 writes the records.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tgo.errors import UserInputError, find_user_error
from tgo.model import build_timm_model
from tgo.observatory.points import points_from_config, resolve_points
from tgo.observatory.sharded import RecordPlan, ShardPlan, observe_and_record
from tgo.records import RecordWriter

__all__ = [
    "CheckpointMismatchError",
    "ModelSource",
    "ObserveError",
    "checkpoint_epoch",
    "compose_observe_config",
    "find_checkpoints",
    "load_state_dict_strict",
    "main",
    "observe",
]

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
MANIFEST_NAME = "analysis_subset.json"
COVARIANCE_POLICIES = ("first_last", "all", "none")
GRAM_DTYPES = {"float64": torch.float64, "float32": torch.float32}
_RUN_OBSERVATION_KEYS = ("points", "gram_dtype", "batch_size", "num_workers", "nonfinite", "fit_range")


class ObserveError(UserInputError):
    """Bad input to ``tgo.observe``: a missing file, a directory that is not a run, conflicting options."""


class CheckpointMismatchError(ObserveError):
    """A checkpoint or weights file does not fit the model (missing, unexpected or differently shaped keys)."""


@dataclass(frozen=True)
class ModelSource:
    """One model to observe, before it is loaded.

    Attributes:
        kind: ``checkpoint`` or ``timm``.
        path: The checkpoint or weights file (``None`` for a random or pretrained timm model).
        epoch: Completed training epochs (the record's epoch label).
        step: Optimiser steps (the record's step).
    """

    kind: str
    path: Path | None
    epoch: int
    step: int


# ----------------------------------------------------------------------------------------------------- checkpoints
def _torch_load(path: Path) -> dict[str, Any]:
    """Loads a checkpoint on the CPU (memory-mapped where possible, so reading metadata is cheap).

    ``weights_only=False`` because Lightning checkpoints pickle hyper-parameters and loop state: only observe
    checkpoints you trust, as with ``torch.load`` itself.
    """
    if not path.is_file():
        raise ObserveError(f"{path}: no such checkpoint file")
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except RuntimeError:  # not a zip archive (legacy format): mmap unsupported
            return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise ObserveError(f"{path}: not a readable PyTorch checkpoint ({type(err).__name__}: {err})") from err


def checkpoint_epoch(checkpoint: dict[str, Any]) -> tuple[int, bool]:
    """The completed training epochs of a Lightning checkpoint, and whether it was saved at an epoch end.

    Args:
        checkpoint: A loaded Lightning checkpoint.

    Returns:
        ``(epochs, at_epoch_end)``; see the module docstring for the rule.

    Raises:
        ObserveError: no ``epoch`` entry (not a Lightning checkpoint).
    """
    if "epoch" not in checkpoint:
        raise ObserveError("not a Lightning checkpoint (no 'epoch' entry)")
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current")
    if not progress or "processed" not in progress:
        return int(checkpoint["epoch"]) + 1, True
    processed, started = int(progress["processed"]), int(progress.get("started", progress["processed"]))
    return processed, processed >= started


def _checkpoint_source(path: Path) -> ModelSource:
    checkpoint = _torch_load(path)
    try:
        epoch, at_end = checkpoint_epoch(checkpoint)
    except ObserveError as err:
        raise ObserveError(f"{path}: {err}") from err
    step = int(checkpoint.get("global_step", 0))
    if not at_end:
        warnings.warn(f"[tgo] {path.name} was saved in the middle of an epoch (step {step}); it is labelled with the "
                      f"{epoch} epochs completed before it", RuntimeWarning, stacklevel=2)
    return ModelSource("checkpoint", path, epoch, step)


def find_checkpoints(directory: str | Path) -> list[ModelSource]:
    """Every ``*.ckpt`` of a directory as sources in epoch order; the same weights saved twice count once.

    ``last.ckpt`` and ``best_epoch_NNN.ckpt`` often hold the same epoch: files with the same epoch label and step
    are duplicates and the first by name is kept.

    Raises:
        ObserveError: not a directory, no checkpoint in it, or two checkpoints with the same epoch label but
            different steps (say which file to observe with --checkpoint).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ObserveError(f"{directory}: not a directory (expected a run's checkpoints/ directory)")
    files = sorted(directory.glob("*.ckpt"))
    if not files:
        raise ObserveError(f"{directory}: no *.ckpt files")
    by_epoch: dict[int, ModelSource] = {}
    for path in files:
        source = _checkpoint_source(path)
        kept = by_epoch.get(source.epoch)
        if kept is None:
            by_epoch[source.epoch] = source
        elif kept.step != source.step:
            raise ObserveError(f"{kept.path.name} (step {kept.step}) and {path.name} (step {source.step}) are both "
                               f"labelled epoch {source.epoch}; observe one of them with --checkpoint")
    return [by_epoch[e] for e in sorted(by_epoch)]


def load_state_dict_strict(net: torch.nn.Module, state: dict[str, torch.Tensor], *, origin: str) -> None:
    """Loads weights exactly, or fails naming the missing, unexpected and differently shaped keys.

    Raises:
        CheckpointMismatchError: the state dict does not fit ``net``.
    """
    own = net.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} vs model {tuple(own[k].shape)}" for k in own
              if k in state and hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        def show(keys: list[str]) -> str:
            return ", ".join(keys[:8]) + (f" ... ({len(keys)} in all)" if len(keys) > 8 else "")

        parts = [f"missing keys: {show(missing)}" if missing else "",
                 f"unexpected keys: {show(unexpected)}" if unexpected else "",
                 f"shape mismatches: {show(shapes)}" if shapes else ""]
        raise CheckpointMismatchError(f"{origin} does not fit the model ({'; '.join(p for p in parts if p)})")
    net.load_state_dict(state, strict=True)


def _net_from_checkpoint(path: Path) -> torch.nn.Module:
    """Rebuilds the timm network of a ViTClassifier checkpoint from its hyper-parameters and loads its weights."""
    checkpoint = _torch_load(path)
    hp = checkpoint.get("hyper_parameters") or {}
    if "name" not in hp or "state_dict" not in checkpoint:
        raise ObserveError(f"{path}: not a tgo.model.ViTClassifier checkpoint (needs hyper_parameters with the timm "
                           f"'name' and a state_dict); for a plain weights file use --timm NAME --weights FILE")
    net = build_timm_model(hp["name"], num_classes=int(hp.get("num_classes", 1000)), img_size=int(hp["img_size"]),
                           in_chans=int(hp.get("in_chans", 3)), **dict(hp.get("arch") or {}))
    state = {k[len("net."):]: v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
    if not state:
        raise CheckpointMismatchError(f"{path}: its state_dict has no 'net.*' keys, so it is not a "
                                      f"tgo.model.ViTClassifier checkpoint (first keys: "
                                      f"{', '.join(list(checkpoint['state_dict'])[:5])})")
    load_state_dict_strict(net, state, origin=str(path))
    return net


def _load_weights_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ObserveError(f"--weights {path}: no such file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = _torch_load(path)
    for key in ("state_dict", "model", "state_dict_ema"):  # common wrappers of saved weights
        if isinstance(state.get(key), dict):
            state = state[key]
            break
    return {k.removeprefix("module."): v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _timm_net(name: str, *, pretrained: bool, weights: Path | None, seed: int, img_size: int,
              in_chans: int, arch: dict[str, Any]) -> torch.nn.Module:
    """A timm model without its classifier head (never observed), randomly initialised or with weights."""
    torch.manual_seed(seed)
    net = build_timm_model(name, num_classes=0, img_size=img_size, in_chans=in_chans, pretrained=pretrained, **arch)
    if weights is not None:
        state = {k: v for k, v in _load_weights_file(weights).items() if not k.startswith("head.")}
        load_state_dict_strict(net, state, origin=f"--weights {weights}")
    return net


# ----------------------------------------------------------------------------------------------------- config
def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def compose_observe_config(overrides: Sequence[str] = (), run_dir: Path | None = None) -> DictConfig:
    """Composes ``conf/observe.yaml`` with overrides; with a run, the run's data and observation settings win.

    Args:
        overrides: Hydra overrides (``data=synthetic``, ``data.image_size=32``, ``observation.gram_dtype=float32``,
            ``fabric.devices=2``).
        run_dir: The run the model came from, if any: its ``config.yaml`` data node (with the analysis subset
            pinned to its ``analysis_subset.json``) and its ``callbacks.spectral_geometry`` settings become the
            defaults; ``data.*`` and ``observation.*`` overrides still apply on top. A ``data=<group>`` override
            replaces the run's data entirely.

    Returns:
        The composed config (``data``, ``model``, ``observation``, ``fabric``).

    Raises:
        ObserveError: a malformed override or an unknown config group/key.
    """
    overrides = list(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("observe", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ObserveError(f"bad override ({err})") from err
    OmegaConf.set_struct(cfg, False)  # the run's settings and the record of the source are merged in below
    if run_dir is None:
        return cfg
    run_cfg = OmegaConf.load(run_dir / "config.yaml")
    keys = [_override_key(o) for o in overrides]
    dotlist = [o.lstrip("+") for o in overrides if "=" in o]
    if "data" not in keys and "data" in run_cfg:
        data = OmegaConf.merge(run_cfg.data, OmegaConf.from_dotlist(
            [d[len("data."):] for d in dotlist if d.startswith("data.")]))
        if "data.analysis.manifest" not in keys and (run_dir / MANIFEST_NAME).is_file():
            OmegaConf.update(data, "analysis.manifest", str(run_dir / MANIFEST_NAME), force_add=True)
        cfg.data = data
    callback = OmegaConf.select(run_cfg, "callbacks.spectral_geometry")
    if callback is not None:
        from_run = {k: callback[k] for k in _RUN_OBSERVATION_KEYS if k in callback}
        user = OmegaConf.from_dotlist([d[len("observation."):] for d in dotlist if d.startswith("observation.")])
        cfg.observation = OmegaConf.merge(cfg.observation, from_run, user)
    return cfg


def _run_dir_of(checkpoint_dir: Path) -> Path | None:
    """The run a checkpoints directory belongs to (its parent holding config.yaml), if any."""
    parent = checkpoint_dir.resolve().parent
    return parent if (parent / "config.yaml").is_file() else None


# ----------------------------------------------------------------------------------------------------- observe
def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ObserveError(f"--out {out}: exists and is not a directory")
    if (out / "geometry").exists() and any((out / "geometry").iterdir()):
        raise ObserveError(f"--out {out}: already holds geometry records; choose a new directory (records of "
                           "different models must not mix)")


def _validate_observation(obs: DictConfig) -> None:
    if obs.gram_dtype not in GRAM_DTYPES:
        raise ObserveError(f"observation.gram_dtype: expected one of {list(GRAM_DTYPES)}, got {obs.gram_dtype!r}")
    if obs.covariance not in COVARIANCE_POLICIES:
        raise ObserveError(f"observation.covariance: expected one of {COVARIANCE_POLICIES}, got {obs.covariance!r}")
    if obs.nonfinite not in ("warn", "error"):
        raise ObserveError(f"observation.nonfinite: expected warn or error, got {obs.nonfinite!r}")


def _sources(checkpoint: str | None, checkpoints: str | None, run: str | None, timm_name: str | None,
             epoch: int) -> tuple[list[ModelSource], Path | None]:
    given = [x for x in (checkpoint, checkpoints, run, timm_name) if x is not None]
    if len(given) != 1:
        raise ObserveError("give exactly one model source: --checkpoint FILE, --checkpoints DIR, --run RUN_DIR or "
                           "--timm NAME")
    if checkpoint is not None:
        path = Path(checkpoint)
        return [_checkpoint_source(path)], _run_dir_of(path.parent)
    if run is not None:
        run_path = Path(run)
        if not (run_path / "checkpoints").is_dir():
            raise ObserveError(f"--run {run_path}: not a run directory with checkpoints/ (expected "
                               f"{run_path / 'checkpoints'})")
        checkpoints = str(run_path / "checkpoints")
    if checkpoints is not None:
        directory = Path(checkpoints)
        return find_checkpoints(directory), _run_dir_of(directory)
    return [ModelSource("timm", None, int(epoch), 0)], None


def _with_covariance(policy: str, index: int, count: int) -> bool:
    return policy == "all" or (policy == "first_last" and index in (0, count - 1))


def _iter_nets(sources: Sequence[ModelSource], *, timm_name: str | None, pretrained: bool, weights: Path | None,
               seed: int, img_size: int, in_chans: int, arch: dict[str, Any]
               ) -> Iterator[tuple[ModelSource, torch.nn.Module]]:
    """Loads one model at a time, so a trajectory of large checkpoints never holds two in memory."""
    for source in sources:
        if source.kind == "checkpoint":
            yield source, _net_from_checkpoint(source.path)
        else:
            yield source, _timm_net(timm_name, pretrained=pretrained, weights=weights, seed=seed, img_size=img_size,
                                    in_chans=in_chans, arch=arch)


def _check_fits_data(net: torch.nn.Module, datamodule: Any, source: ModelSource) -> None:
    patch = getattr(net, "patch_embed", None)
    img_size = getattr(patch, "img_size", None)
    if img_size is not None and tuple(img_size) != (datamodule.image_size, datamodule.image_size):
        raise ObserveError(f"{source.path or 'the model'} expects {tuple(img_size)} images but the data gives "
                           f"{datamodule.image_size} px; set data.image_size={img_size[0]}")
    proj = getattr(patch, "proj", None)
    if proj is not None and getattr(proj, "in_channels", datamodule.in_chans) != datamodule.in_chans:
        raise ObserveError(f"{source.path or 'the model'} expects {proj.in_channels} input channels but the data "
                           f"gives {datamodule.in_chans}")


def observe(*, out: str | Path, checkpoint: str | None = None, checkpoints: str | None = None,
            run: str | None = None, timm_name: str | None = None, pretrained: bool = False,
            weights: str | None = None, seed: int = 0, epoch: int = 0,
            overrides: Sequence[str] = ()) -> list[ModelSource]:
    """Observes one model or a checkpoint trajectory and writes training-compatible records to ``out``.

    Args:
        out: Output directory: ``geometry/``, ``analysis_subset.json`` and ``config.yaml`` are written there.
        checkpoint: A ViTClassifier checkpoint file.
        checkpoints: A directory of checkpoints (all ``*.ckpt``, epoch order, duplicates once).
        run: A run directory (its ``checkpoints/``).
        timm_name: A timm model name.
        pretrained: Load the timm model's pretrained weights (needs a reachable hub or cache).
        weights: A local weights file for the timm model (``.safetensors`` or a torch state dict; ``head.*`` keys
            are ignored since the classifier is not observed).
        seed: Seed of a randomly initialised timm model.
        epoch: Epoch label of a timm model's observation.
        overrides: Hydra overrides of ``conf/observe.yaml`` (see `compose_observe_config`).

    Returns:
        The observed sources, in the order observed (epoch order).

    Raises:
        ObserveError: bad input (see the error's message); CheckpointMismatchError for weights that do not fit.
    """
    import lightning as L

    out = Path(out)
    if timm_name is None and (pretrained or weights is not None):
        raise ObserveError("--pretrained and --weights only apply to --timm NAME")
    sources, run_dir = _sources(checkpoint, checkpoints, run, timm_name, epoch)
    cfg = compose_observe_config(overrides, run_dir)
    obs = cfg.observation
    _validate_observation(obs)
    _check_out(out)

    fabric = L.Fabric(accelerator=cfg.fabric.accelerator, devices=cfg.fabric.devices,
                      num_nodes=cfg.fabric.num_nodes, strategy=cfg.fabric.strategy, precision="32-true")
    fabric.launch()
    datamodule = instantiate(cfg.data).validate()
    writer = RecordWriter(out)
    fabric.barrier("tgo_observe_setup")  # every rank has checked its input before rank 0 writes anything
    if fabric.is_global_zero:
        out.mkdir(parents=True, exist_ok=True)
        datamodule.write_manifest(out)
        described = [{"kind": s.kind, "path": None if s.path is None else str(s.path.resolve()), "epoch": s.epoch,
                      "step": s.step} for s in sources]
        saved = OmegaConf.merge(cfg, {"source": {"run": None if run_dir is None else str(run_dir), "timm": timm_name,
                                                 "pretrained": pretrained, "weights": weights, "seed": seed,
                                                 "models": described}})
        OmegaConf.save(saved, out / "config.yaml", resolve=True)

    plan = ShardPlan(rank=fabric.global_rank, world_size=fabric.world_size,
                     batch_size=int(obs.batch_size or datamodule.analysis_batch_size),
                     num_workers=int(obs.num_workers if obs.num_workers is not None else datamodule.num_workers))
    fit_range = None if obs.fit_range is None else (int(obs.fit_range[0]), int(obs.fit_range[1]))
    arch = {k: v for k, v in (OmegaConf.to_container(cfg.model.arch, resolve=True) or {}).items() if v is not None}
    nets = _iter_nets(sources, timm_name=timm_name, pretrained=pretrained,
                      weights=None if weights is None else Path(weights), seed=seed,
                      img_size=datamodule.image_size, in_chans=datamodule.in_chans, arch=arch)
    for index, (source, net) in enumerate(nets):
        _check_fits_data(net, datamodule, source)
        points = points_from_config(obs.points, net)
        resolve_points(net, points)
        net.to(fabric.device)
        record = RecordPlan(writer=writer, epoch=source.epoch, step=source.step,
                            with_covariance=_with_covariance(obs.covariance, index, len(sources)),
                            nonfinite=obs.nonfinite, fit_range=fit_range)
        results = observe_and_record(net, datamodule.analysis_dataset, points, plan=plan, record=record,
                                     all_reduce_sum=lambda t: fabric.all_reduce(t, reduce_op="sum"),
                                     is_global_zero=fabric.is_global_zero, device=fabric.device,
                                     gram_dtype=GRAM_DTYPES[obs.gram_dtype])
        if results is not None:
            label = source.path.name if source.path is not None else timm_name
            print(f"[tgo] observed {label} as epoch {source.epoch} ({len(results)} points)", file=sys.stderr)
        del net
    fabric.barrier("tgo_observe_done")
    return sources


# ----------------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``python -m tgo.observe`` arguments (see ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m tgo.observe",
        description="Observe the spectral geometry of existing models with the training callback's code path; "
                    "writes records that `python -m tgo.report` reads.",
        epilog="Trailing KEY=VALUE arguments are Hydra overrides of conf/observe.yaml, e.g. data=synthetic "
               "data.image_size=32 observation.gram_dtype=float32 fabric.accelerator=gpu fabric.devices=2 "
               "fabric.strategy=ddp model.arch.depth=4")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a Lightning checkpoint of tgo.model.ViTClassifier")
    source.add_argument("--checkpoints", help="a directory of checkpoints (every *.ckpt, in epoch order)")
    source.add_argument("--run", help="a run directory (observes its checkpoints/)")
    source.add_argument("--timm", dest="timm_name", metavar="NAME", help="a timm model name")
    parser.add_argument("--pretrained", action="store_true", help="with --timm: load pretrained weights (hub)")
    parser.add_argument("--weights", help="with --timm: a local weights file (.safetensors or torch state dict)")
    parser.add_argument("--seed", type=int, default=0, help="with --timm: seed of the random initialisation")
    parser.add_argument("--epoch", type=int, default=0, help="with --timm: epoch label of the observation")
    parser.add_argument("--out", required=True, help="output directory for the records (must not hold records)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides of conf/observe.yaml")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns 0, or 2 after printing one line for bad input."""
    args = parse_args(argv)
    try:
        sources = observe(out=args.out, checkpoint=args.checkpoint, checkpoints=args.checkpoints, run=args.run,
                          timm_name=args.timm_name, pretrained=args.pretrained, weights=args.weights,
                          seed=args.seed, epoch=args.epoch, overrides=args.overrides)
    except Exception as error:
        user_error = find_user_error(error)  # Hydra's instantiate wraps the DataModule's own errors
        if user_error is None:
            raise
        print(f"tgo.observe: error: {user_error}", file=sys.stderr)
        return 2
    if rank_zero_only.rank != 0:  # set by Fabric's launch; other ranks stay quiet
        return 0
    epochs = ", ".join(str(s.epoch) for s in sources)
    print(f"[tgo] records of epoch(s) {epochs} in {Path(args.out).resolve()}; report: python -m tgo.report {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
