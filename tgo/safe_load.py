"""Reading checkpoints without running them: every checkpoint TGO reads is unpickled with ``weights_only=True``.

A ``.ckpt`` is a pickle that could run any code it names. TGO's checkpoints hold tensors and builtins only (the random
states too: ``callbacks/random_state.py``), so a file needing any other global is refused in one line naming it
(`UnsafeCheckpointError`), and nothing of it runs.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tgo.errors import UserInputError

__all__ = [
    "SAFE_GLOBALS",
    "UnsafeCheckpointError",
    "load_weights_only",
    "refused_global",
    "unpickling_reason",
    "unsafe_error",
]

TGO_CHECKPOINT = "a checkpoint written by tgo.train"

SAFE_GLOBALS: list[Any] = []
"""Globals allowed beyond torch's own weights-only set: TGO's own checkpoints need none (tested)."""

# What torch's weights-only unpickler says when it refuses something a pickle names (torch 2.6 - 2.14):
#   "Unsupported global: GLOBAL os.system was not an allowed global by default. ..."
#   "Trying to load unsupported GLOBAL posix.system whose module posix is blocked."
#   "Trying to call reduce for unrecognized function <built-in function exec>"
#   "Can only build Tensor, Parameter, OrderedDict or types allowlisted via `add_safe_globals`, but got <class ..>"
_REFUSALS = (
    re.compile(r"GLOBAL (\S+)"),
    re.compile(r"reduce for unrecognized function (.+?)(?: which belongs to .*)?$", re.MULTILINE),
    re.compile(r"(?:create new object|build) .*but got (.+)$", re.MULTILINE),
)
_WEIGHTS_UNPICKLER = re.compile(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n|$)")


class UnsafeCheckpointError(UserInputError):
    """A checkpoint whose unpickling would build more than tensors and plain values."""

    def __init__(self, message: str, *, path: Path | None = None, refused: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.refused = refused


def refused_global(error: BaseException) -> str | None:
    """What torch's weights-only unpickler refused, from an error or its cause chain; ``None`` when it refused
    nothing (the file is damaged, or not a pickle: an error of another kind)."""
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, pickle.UnpicklingError):
            text = _core(str(current))
            for pattern in _REFUSALS:
                found = pattern.search(text)
                if found:
                    return found.group(1).rstrip(".")
        current = current.__cause__ or current.__context__
    return None


def unpickling_reason(error: BaseException) -> str:
    """An unpickling error as one line (torch's weights-only message spans a dozen lines of advice)."""
    text = _core(str(error)).strip() or type(error).__name__
    return f"{type(error).__name__}: {' '.join(text.split())}"


def _core(message: str) -> str:
    found = _WEIGHTS_UNPICKLER.search(message)
    return found.group(1) if found else message


def unsafe_error(
    path: str | Path, error: BaseException, *, label: str | None = None, expected: str = TGO_CHECKPOINT
) -> UnsafeCheckpointError | None:
    """The one-line refusal for ``error`` raised while loading ``path``, or ``None`` when it refused nothing; the
    line names the file as ``label`` (default: the path) and says it was ``expected`` to be."""
    refused = refused_global(error)
    if refused is None:
        return None
    return UnsafeCheckpointError(
        f"{label or path}: refused, not loaded: unpickling it would call or build {refused!r}, which is not a tensor "
        f"or a plain value (TGO reads checkpoints with weights_only=True and never runs code from a file); expected "
        f"{expected}",
        path=Path(path),
        refused=refused,
    )


def load_weights_only(
    path: str | Path, *, label: str | None = None, expected: str = TGO_CHECKPOINT, allow: Sequence[Any] = ()
) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True, mmap=True)``; a global outside torch's weights-only
    set, `SAFE_GLOBALS` and ``allow`` is an `UnsafeCheckpointError`."""
    try:
        with torch.serialization.safe_globals([*SAFE_GLOBALS, *allow]):
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:  # not a zip archive (legacy format): mmap unsupported
                if "mmap" not in str(err):
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        refusal = unsafe_error(path, err, label=label, expected=expected)
        if refusal is None:
            raise
        raise refusal from err
