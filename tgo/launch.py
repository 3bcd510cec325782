"""How a training job meets its launcher: one job of a local multirun, a DDP process, a SLURM task.

Lightning's DDP launcher starts the other ranks by re-running ``sys.argv`` and leaves its traces in the launching
process: the environment variables it sets for its children (``LOCAL_RANK`` among them, which makes the *next*
Trainer believe an outside launcher created its processes) and an initialised default process group whose peers
exit with the job. A Hydra multirun runs its jobs one after another in that same process, so without cleaning up
the second job would join the first job's dead process group ("Connection closed by peer"). `distributed_job`
scopes both to one job.

On a SLURM task, requeue has one owner, Lightning (`slurm_requeue_plugins`): it listens for the signal submitit asks
SLURM to send before a preemption or time-limit kill, checkpoints and requeues; the requeued job resumes
(`is_requeued_slurm_job`, `tgo.resume.plan_start`). `LaunchChecks` refuses launcher settings SLURM cannot take before
anything is submitted, and `check_accelerator` a GPU request on a machine without one.
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
    """Runs one training job so that the next job in this process starts from a clean distributed state.

    On exit (success or exception) the default process group is destroyed and the launcher's environment variables
    are restored to what they were before the job: unset where they were unset. A process started by an outside
    launcher (a DDP child, a SLURM task: ``LOCAL_RANK`` set before the job) keeps its environment, since it runs
    exactly one job and its launcher owns those variables.
    """
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
    """The signal SLURM sends ``signal_delay_s`` before a preemption or time-limit kill.

    It is the one submitit writes into the sbatch header (``#SBATCH --signal=USR2@<delay>``), which submitit reads
    from ``SUBMITIT_PREEMPT_SIGNAL`` (default ``USR2``); reading the same variable keeps the two in step.
    """
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper().removeprefix("SIG")
    found = getattr(signal, f"SIG{name}", None)
    if not isinstance(found, signal.Signals):
        raise ConfigError(f"SUBMITIT_PREEMPT_SIGNAL: '{name}' is not a signal name; expected e.g. USR2 or USR1")
    return found


def slurm_requeue_plugins(configured: list[Any]) -> list[Any]:
    """Lightning's SLURM environment listening for the preemption signal, when this process is a SLURM task.

    One owner of requeue: Lightning. On the signal its handler writes ``hpc_ckpt_<n>.ckpt`` into the run directory
    and runs ``scontrol requeue``; the requeued job runs the same command again and `resume_checkpoint` resumes it.
    Lightning registers its handler only where none is installed, and submitit (which runs the job) installs its own
    for the same signal, which would resubmit the job without saving anything. So that handler is put back to the
    default here, just before the trainer (and with it Lightning's handler) is set up. Nothing is added outside
    SLURM or when a cluster environment is configured explicitly.
    """
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
    """Hydra callback: checks what a multirun's launcher needs before it submits anything.

    The SLURM launcher requests one task and one GPU per device (``tasks_per_node = gpus_per_node =
    trainer.devices``) on ``trainer.num_nodes`` nodes, so both must be positive integers; ``devices=auto`` would
    otherwise end in an interpolation traceback from inside submitit. Exits with status 2 and one line.
    """

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
