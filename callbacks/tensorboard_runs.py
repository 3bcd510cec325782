"""``PointRuns``: every observation point as its own TensorBoard run, named so that runs sort in depth order.

TensorBoard colours lines by *run*, never by tag, and lists both alphabetically. Fifteen points logged as fifteen
tags of one run (``geometry/effective_rank/block_01`` ...) are fifteen one-line cards, or one chart of fifteen
same-coloured lines without a legend, in the order ``block_01 .. block_12, cls, patch_embed, pos_embed``. Written
as one run per point instead, under ``<tensorboard log dir>/points/<NN>_<point>`` with the point's index in the
callback's depth-ordered point list as a zero-padded prefix, every chart of a tag (``geometry/effective_rank``) draws
every point as its own coloured line, labelled by its run in the run selector and the tooltip, listed in depth order
(``00_patch_embed``, ``01_pos_embed``, ``02_block_01`` ... ``14_cls``), for any point list (fewer blocks, register
tokens, sub-modules).

Each run is a plain ``torch.utils.tensorboard.SummaryWriter``, opened on the first scalar written for its point (a
point that never gets one leaves no empty run), flushed after every observation so a live TensorBoard shows it, and
closed by `PointRuns.close`. Only the rank that writes (rank 0) ever creates one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

__all__ = ["POINTS_DIR", "PointRuns", "point_run_names"]

POINTS_DIR = "points"
"""Subdirectory of the TensorBoard log dir that holds one run directory per point."""


def point_run_names(points: Sequence[str]) -> dict[str, str]:
    """``{point: run name}``: the point's depth index, zero-padded to a common width, then its name.

    The width is that of the largest index (at least two digits), so names sort in depth order as strings, which is
    how TensorBoard lists runs.

    Raises:
        ValueError: a point name repeats (two points would share one run).
    """
    if len(set(points)) != len(points):
        raise ValueError(f"point_run_names: point names must be unique, got {list(points)}")
    width = max(2, len(str(max(len(points) - 1, 0))))
    return {point: f"{index:0{width}d}_{point}" for index, point in enumerate(points)}


class PointRuns:
    """One TensorBoard run (``SummaryWriter``) per observation point, created lazily under ``<log_dir>/points/``.

    Args:
        log_dir: The TensorBoard log directory of the training run (the Lightning ``TensorBoardLogger.log_dir``).
        points: Point names in depth order (the callback's observation points).
    """

    def __init__(self, log_dir: str | os.PathLike[str], points: Sequence[str]) -> None:
        self.root = Path(log_dir) / POINTS_DIR
        self.names = point_run_names(points)
        self._writers: dict[str, SummaryWriter] = {}

    def run_dir(self, point: str) -> Path:
        """The run directory of ``point`` (which must be one of the points this was made with)."""
        return self.root / self.names[point]

    def write(self, scalars: Mapping[str, Mapping[str, float]], step: int) -> None:
        """Writes ``{point: {tag: value}}`` at ``step`` (the epoch) and flushes every run written to.

        Raises:
            KeyError: a point that is not in the point list (its run would sort out of depth order).
        """
        for point, tags in scalars.items():
            writer = self._writer(point)
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

    def _writer(self, point: str) -> SummaryWriter:
        if point not in self._writers:
            self._writers[point] = SummaryWriter(log_dir=str(self.run_dir(point)))
        return self._writers[point]
