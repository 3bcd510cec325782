"""How a training job meets its launcher: one job of a local multirun, a DDP process, a SLURM task.

Lightning's DDP launcher leaves environment variables (``LOCAL_RANK`` makes the next Trainer believe an outside
launcher made its processes) and a process group whose peers exit with the job; a Hydra multirun's second job would
join that dead group. `distributed_job` scopes both to one job. On SLURM, Lightning alone owns requeue
(`slurm_requeue_plugins`); `LaunchChecks` refuses launcher settings SLURM cannot take before anything is submitted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from tgo.errors import ConfigError

# What Lightning's subprocess launcher writes into the launching process's environment for its children
# (lightning.fabric.strategies.launchers.subprocess_script._call_children_scripts).
LAUNCHER_ENVIRONMENT = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


@contextlib.contextmanager
def distributed_job() -> Iterator[None]:
    """Runs one training job and then destroys the process group and restores the launcher's variables, so the next job
    in this process starts clean (an outside launcher's process keeps its environment)."""
    before = {name: os.environ.get(name) for name in LAUNCHER_ENVIRONMENT}
    try:
        yield
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        if before["LOCAL_RANK"] is None:  # this process launched its ranks itself
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


# ------------------------------------------------------------------------------------------------ SLURM requeue
def preemption_signal() -> signal.Signals:
    """The signal SLURM sends before a kill: submitit's ``SUBMITIT_PREEMPT_SIGNAL`` (default ``USR2``)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper().removeprefix("SIG")
    found = getattr(signal, f"SIG{name}", None)
    if not isinstance(found, signal.Signals):
        raise ConfigError(f"SUBMITIT_PREEMPT_SIGNAL: '{name}' is not a signal name; expected e.g. USR2 or USR1")
    return found


def slurm_requeue_plugins(configured: list[Any]) -> list[Any]:
    """Lightning's SLURM environment listening for the preemption signal on a SLURM task: on it Lightning writes
    ``hpc_ckpt_<n>.ckpt`` and requeues. submitit's handler (which would resubmit without saving) is reset to the
    default, since Lightning registers only where none is set."""
    from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment

    if any(isinstance(p, ClusterEnvironment) for p in configured) or not SLURMEnvironment.detect():
        return []
    requeue_signal = preemption_signal()
    if threading.current_thread() is threading.main_thread():
        signal.signal(requeue_signal, signal.SIG_DFL)
    return [SLURMEnvironment(auto_requeue=True, requeue_signal=requeue_signal)]


def is_requeued_slurm_job() -> bool:
    """Whether SLURM restarted this job (``scontrol requeue``, preemption or node failure): ``SLURM_RESTART_COUNT``."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return SLURMEnvironment.detect() and int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0


def check_accelerator(accelerator: str) -> None:
    """Stops before any work when ``trainer.accelerator`` asks for a GPU this machine does not have."""
    if str(accelerator).lower() in {"gpu", "cuda"} and not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.accelerator: '{accelerator}' but no CUDA GPU is visible on this machine "
            "(torch.cuda.is_available() is False); expected trainer.accelerator=cpu or auto here, or a GPU node"
        )


# ------------------------------------------------------------------------------------------------ launcher checks
class LaunchChecks(Callback):
    """Hydra callback: the SLURM launcher needs ``trainer.devices`` and ``num_nodes`` as positive integers (``auto``
    would end in a submitit traceback); exits 2 with one line before anything is submitted."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        if not target.endswith("SlurmLauncher"):
            return
        for key in ("trainer.devices", "trainer.num_nodes"):
            value = OmegaConf.select(config, key, default=None)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                print(
                    f"tgo.train: error: {key}: {value!r} with hydra/launcher=slurm; expected a positive integer "
                    "(SLURM gets one task and one GPU per device, e.g. trainer.devices=8)",
                    file=sys.stderr,
                )
                sys.exit(2)
