"""``PointRuns``: every observation point as its own TensorBoard run, named so that runs sort in depth order.

TensorBoard colours lines by run, never by tag, and lists both alphabetically, so fifteen points as tags of one run
would be same-coloured lines in the order ``block_01 .. block_12, cls, patch_embed``. As one run per point, ``<log
dir>/points/<NN>_<point>``, each point is its own coloured line, listed in depth order. A run is opened on its point's
first scalar (no empty runs); only rank 0 ever creates one."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

__all__ = ["POINTS_DIR", "PointRuns", "point_run_names"]

POINTS_DIR = "points"  # the folder of the TensorBoard log dir that holds one run per point


def point_run_names(points: Sequence[str]) -> dict[str, str]:
    """``{point: run name}``: the depth index, zero-padded to a common width (so names sort as strings), then the name;
    a repeated name is refused."""
    if len(set(points)) != len(points):
        raise ValueError(f"point_run_names: point names must be unique, got {list(points)}")
    width = max(2, len(str(max(len(points) - 1, 0))))
    return {point: f"{index:0{width}d}_{point}" for index, point in enumerate(points)}


class PointRuns:
    """One TensorBoard run (``SummaryWriter``) per observation point, created lazily under ``<log_dir>/points/``."""

    def __init__(self, log_dir: str | os.PathLike[str], points: Sequence[str]) -> None:
        self.root = Path(log_dir) / POINTS_DIR
        self.names = point_run_names(points)
        self._writers: dict[str, SummaryWriter] = {}

    def run_dir(self, point: str) -> Path:
        """The run directory of ``point`` (which must be one of the points this was made with)."""
        return self.root / self.names[point]

    def write(self, scalars: Mapping[str, Mapping[str, float]], step: int) -> None:
        """Writes ``{point: {tag: value}}`` at ``step`` and flushes; a point not in the list raises KeyError."""
        for point, tags in scalars.items():
            if point not in self._writers:
                self._writers[point] = SummaryWriter(log_dir=str(self.run_dir(point)))
            writer = self._writers[point]
            for tag, value in tags.items():
                writer.add_scalar(tag, value, global_step=step)
        self.flush()

    def flush(self) -> None:
        """Makes everything written so far visible to a running TensorBoard."""
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        """Flushes and closes every run; a later `write` opens them again (appending a new event file)."""
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()
