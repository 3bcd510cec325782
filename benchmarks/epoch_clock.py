"""The wall clock of a training's epochs, for rows 17.7-17.8 of ``python -m benchmarks`` (`callback_cost_bench`).

`EpochClock` is a Lightning callback the bench adds to a ``python -m tgo.train`` fit through Hydra
(``+callbacks.epoch_clock._target_=benchmarks.epoch_clock.EpochClock``): at the end of training rank 0 writes the
``time.time()`` at which each training epoch started and the fit's end, so the bench can price an observation against
the epochs of the *same* fit that no observation or background summary touched. Two fits on this machine differ in
speed by up to 8 % (the rows 17 notes in docs/benchmarks.md); epochs of one fit do not.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback


class EpochClock(Callback):
    """Writes when every training epoch started and when the fit ended (``{"starts": [...], "end": t}``) to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.starts: list[float] = []
        self.end: float | None = None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.starts.append(time.time())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.end = time.time()
        if trainer.is_global_zero:
            partial = self.path.with_name(self.path.name + f".{os.getpid()}.partial")
            partial.write_text(json.dumps({"starts": self.starts, "end": self.end}), encoding="utf-8")
            partial.replace(self.path)
