"""How a training job meets its launcher: one job of a local multirun, a DDP process, a SLURM task.

Lightning's DDP launcher starts the other ranks by re-running ``sys.argv`` and leaves its traces in the launching
process: the environment variables it sets for its children (``LOCAL_RANK`` among them, which makes the *next*
Trainer believe an outside launcher created its processes) and an initialised default process group whose peers
exit with the job. A Hydra multirun runs its jobs one after another in that same process, so without cleaning up
the second job would join the first job's dead process group ("Connection closed by peer"). `distributed_job`
scopes both to one job.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch.distributed as dist

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
