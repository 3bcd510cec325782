"""Streaming covariance with exact, shift-stabilised float64 sums; O(D^2) state per point, no activations kept.

ViT residual streams carry dimensions whose mean is 1e3 times their spread, so naive sums of ``x`` and ``x x^T``
cancel catastrophically; sums of ``x - shift`` (the first batch's mean) are exact to ~1e-15 and combine across ranks
by one sum all-reduce once the ranks share a shift (``docs/design-facts.md``). TF32 and autocast are kept off.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import torch

__all__ = ["StreamingCovariance", "allreduce_accumulators", "strict_fp32_math"]

_STATE_VERSION = 1
_GRAM_DTYPES = {torch.float64: "float64", torch.float32: "float32"}


def _fp32_precision_knobs() -> list[tuple[Any, str, Any]]:
    """The per-backend float32 precision switches as ``(namespace, attribute, strict value)`` (torch >= 2.9 raises on
    the legacy booleans once the two APIs were mixed)."""
    knobs: list[tuple[Any, str, Any]] = []
    families = [
        ("cuda", "matmul"),
        ("cudnn", "conv"),
        ("cudnn", "rnn"),
        ("mkldnn", "matmul"),
        ("mkldnn", "conv"),
        ("mkldnn", "rnn"),
    ]
    for backend, op in families:
        namespace = getattr(getattr(torch.backends, backend, None), op, None)
        if namespace is not None and hasattr(namespace, "fp32_precision"):
            knobs.append((namespace, "fp32_precision", "ieee"))
    if knobs:
        return knobs
    return [(torch.backends.cuda.matmul, "allow_tf32", False), (torch.backends.cudnn, "allow_tf32", False)]


def _try_read(read: Callable[[], Any]) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, None)`` when torch refuses the read (mixed legacy/new TF32 API state)."""
    try:
        return True, read()
    except RuntimeError:
        return False, None


@contextlib.contextmanager
def strict_fp32_math(device_type: str) -> Iterator[None]:
    """IEEE float32 matmuls and convolutions, autocast off, for the enclosed code; the previous settings restored after.

    Autocast, ``allow_tf32`` or ``set_float32_matmul_precision("medium")`` would silently make the float32 Gram product
    a 10- or 8-bit-mantissa one; both the legacy switches and every per-backend ``fp32_precision`` are set.
    """
    knobs = _fp32_precision_knobs()
    saved_knobs = [(namespace, attr, getattr(namespace, attr)) for namespace, attr, _ in knobs]
    has_precision, previous_precision = _try_read(torch.get_float32_matmul_precision)
    has_cudnn, previous_cudnn = _try_read(lambda: torch.backends.cudnn.allow_tf32)
    try:
        if has_precision:
            torch.set_float32_matmul_precision("highest")
        if has_cudnn:
            torch.backends.cudnn.allow_tf32 = False
        for namespace, attr, strict in knobs:
            if getattr(namespace, attr) != strict:
                setattr(namespace, attr, strict)
        with torch.autocast(device_type=device_type, enabled=False):
            yield
    finally:
        if has_cudnn:
            torch.backends.cudnn.allow_tf32 = previous_cudnn
        if has_precision:
            torch.set_float32_matmul_precision(previous_precision)
        for namespace, attr, previous in reversed(saved_knobs):
            if getattr(namespace, attr) != previous:
                setattr(namespace, attr, previous)


F = TypeVar("F", bound=Callable[..., Any])


def _outside_inference_mode(method: F) -> F:
    """Run a state-touching method with inference mode off: inference-mode state could not be updated in place later."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode(False):
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _shifted_sums(s1: torch.Tensor, s2: torch.Tensor, n: int, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sums ``(S1, S2)`` of ``n`` rows relative to ``old_shift - delta``: ``S1 + n d``, ``S2 + d S1^T + S1 d^T + n d
    d^T``."""
    s2_new = s2 + torch.outer(delta, s1) + torch.outer(s1, delta) + n * torch.outer(delta, delta)
    s1_new = s1 + n * delta
    return s1_new, s2_new


def _centred(rows: torch.Tensor, shift: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """``rows - shift`` in ``work`` as a new tensor. Rows of another dtype are widened first and the shift subtracted
    in place: the same values bit for bit (the widening is exact), but on a CPU torch's mixed-dtype subtraction takes a
    scalar casting loop, 25x slower (9.0 against 0.34 ms for float32 ``[3152, 384]`` into float64 on one thread), as
    much as a third of the float64 Gram beside it."""
    if rows.dtype == work:
        return rows - shift.to(work)
    return rows.to(work).sub_(shift.to(work))


def _column_sum(centred: torch.Tensor) -> torch.Tensor:
    """Column sums of the centred rows as float64 ``[D]``; float32 rows are summed in float32 (the Gram's precision,
    ~10x cheaper) since ``S1`` enters only through the small ``S1 S1^T / n``."""
    if centred.dtype == torch.float64:
        return centred.sum(dim=0)
    return centred.sum(dim=0).to(torch.float64)


# Below this width one product is cheaper than the strips of `_add_gram`.
_STRIPS_MIN_DIM = 64
_GRAM_STRIPS = 4


def _add_gram(s2: torch.Tensor, c: torch.Tensor) -> None:
    """``s2 += c^T c`` from the strips on and above the diagonal only, the blocks below it copied from above.

    Four equal strips of columns (one below 64 features): strip ``i`` is ``c[:, i]^T c[:, i:]``, 5/8 of the
    multiply-adds of the whole product. A float64 strip is added by the product itself (``addmm_`` into a view of
    ``s2``, no temporary); a float32 one is widened first. Measured against three halving blocks (11/16 of the flops,
    each product in a temporary; one thread, ``[3152, 384]``): 3-6 % faster, and 16 % at the ``[394, 384]`` slices of a
    jackknife group (two threads)."""
    d = c.shape[1]
    count = _GRAM_STRIPS if d >= _STRIPS_MIN_DIM else 1
    strips = list(itertools.pairwise(round(i * d / count) for i in range(count + 1)))
    for lo, hi in strips:  # rows [lo, hi) x columns [lo, D)
        if c.dtype == torch.float64:
            s2[lo:hi, lo:].addmm_(c[:, lo:hi].T, c[:, lo:])
        else:
            s2[lo:hi, lo:] += torch.mm(c[:, lo:hi].T, c[:, lo:]).to(torch.float64)
    for lo, hi in strips[:-1]:
        s2[hi:, lo:hi] = s2[lo:hi, hi:].T


class StreamingCovariance:
    """Exact streaming covariance of the rows of ``[..., dim]`` activation batches: ``n``, ``n_nonfinite`` (rows dropped
    for NaN/Inf), a fixed ``shift`` and the shifted sums ``S1``, ``S2``, float64 on ``device``. ``gram_dtype`` float32
    casts the shifted rows for the matmul (~1e-8 relative) and still accumulates in float64."""

    @_outside_inference_mode
    def __init__(self, dim: int, *, gram_dtype: torch.dtype = torch.float64, device: torch.device | str | None = None):
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"StreamingCovariance: dim must be a positive int, got {dim!r}")
        if gram_dtype not in _GRAM_DTYPES:
            raise ValueError(
                f"StreamingCovariance: gram_dtype must be torch.float64 or torch.float32, got {gram_dtype!r}"
            )
        self.dim: int = dim
        self.gram_dtype: torch.dtype = gram_dtype
        self.device: torch.device = torch.device(device) if device is not None else torch.device("cpu")
        self.n: int = 0
        self.n_nonfinite: int = 0
        self.shift: torch.Tensor | None = None
        self._s1 = torch.zeros(dim, dtype=torch.float64, device=self.device)
        self._s2 = torch.zeros(dim, dim, dtype=torch.float64, device=self.device)

    def __repr__(self) -> str:
        return (
            f"StreamingCovariance(dim={self.dim}, gram_dtype={_GRAM_DTYPES[self.gram_dtype]}, device={self.device}, "
            f"n={self.n}, n_nonfinite={self.n_nonfinite})"
        )

    # ------------------------------------------------------------------ streaming
    @_outside_inference_mode
    def update(self, x: torch.Tensor) -> None:
        """Add the rows of one batch (any floating dtype and device); rows with NaN or Inf are dropped and counted."""
        x = torch.as_tensor(x)
        if x.ndim == 0 or x.shape[-1] != self.dim:
            raise ValueError(
                f"StreamingCovariance.update: expected last dimension {self.dim} (shape [..., {self.dim}]), "
                f"got shape {tuple(x.shape)}"
            )
        rows = x.detach().reshape(-1, self.dim).to(device=self.device)
        if rows.shape[0] == 0:
            return
        # A float64 Gram centres float32 activations in float64 (`_centred`: widened, then the shift subtracted in
        # place). With a float32 Gram the centring itself runs in float32 against a shift rounded to float32; any fixed
        # shift is exact algebra, and the centred rows would be rounded to float32 for the product anyway. Integer or
        # float64 input is centred in float64.
        work = (
            torch.float32
            if self.gram_dtype == torch.float32 and rows.is_floating_point() and (rows.dtype != torch.float64)
            else torch.float64
        )
        if rows.is_floating_point() and rows.dtype not in (torch.float32, torch.float64):
            rows = rows.to(work)  # float16/bfloat16 -> exact widening
        # Fast path: NaN/Inf anywhere propagates into the column sums, so one [D] check (one host sync) screens the
        # whole batch; only a batch that fails it pays for the per-row filter.
        shift = self._first_shift(rows, work) if self.n == 0 or self.shift is None else self.shift
        centred = _centred(rows, shift, work)
        col_sum = _column_sum(centred)
        if not bool(torch.isfinite(col_sum).all()):
            finite = torch.isfinite(rows).all(dim=1)
            n_finite = int(finite.sum().item())
            self.n_nonfinite += rows.shape[0] - n_finite
            if n_finite == 0:
                return
            rows = rows[finite]
            shift = self._first_shift(rows, work) if self.n == 0 or self.shift is None else self.shift
            centred = _centred(rows, shift, work)
            col_sum = _column_sum(centred)
        if self.n == 0:
            # The sums are zero, so (re)setting the shift is exact; this also replaces a placeholder shift adopted from
            # an all-reduce in which no rank had rows.
            self.shift = shift
        self._s1 += col_sum
        with strict_fp32_math(self.device.type):
            _add_gram(self._s2, centred.to(self.gram_dtype))  # no copy when the centring ran in the Gram dtype
        self.n += rows.shape[0]

    @staticmethod
    def _first_shift(rows: torch.Tensor, work: torch.dtype) -> torch.Tensor:
        """The first batch's mean in float64, rounded to ``work`` so ``rows - shift`` in ``work`` uses it exactly."""
        shift = rows.mean(dim=0, dtype=torch.float64)
        return shift.to(work).to(torch.float64) if work != torch.float64 else shift

    # ------------------------------------------------------------------ results
    @_outside_inference_mode
    def mean(self) -> torch.Tensor:
        """Mean of the finite rows seen, float64 ``[dim]``; all-NaN when no rows were seen (documented, not raised)."""
        if self.n == 0 or self.shift is None:
            return torch.full((self.dim,), math.nan, dtype=torch.float64, device=self.device)
        return self.shift + self._s1 / self.n

    @_outside_inference_mode
    def covariance(self) -> torch.Tensor:
        """Unbiased covariance ``(S2 - S1 S1^T / n) / (n - 1)``, exactly symmetric; all NaN below 2 rows, so one starved
        point cannot abort a multi-point observation."""
        if self.n < 2:
            return torch.full((self.dim, self.dim), math.nan, dtype=torch.float64, device=self.device)
        cov = (self._s2 - torch.outer(self._s1, self._s1) / self.n) / (self.n - 1)
        return (cov + cov.T) / 2

    # ------------------------------------------------------------------ algebra
    @_outside_inference_mode
    def reshift(self, new_shift: torch.Tensor) -> None:
        """Change the shift, exactly re-expressing the sums; an empty accumulator adopts ``new_shift``."""
        new = torch.as_tensor(new_shift).to(device=self.device, dtype=torch.float64).detach()
        if tuple(new.shape) != (self.dim,):
            raise ValueError(f"reshift: expected shift of shape ({self.dim},), got {tuple(new.shape)}")
        if not bool(torch.isfinite(new).all()):
            raise ValueError("reshift: new shift must be finite")
        if self.n > 0 and self.shift is not None:
            self._s1, self._s2 = _shifted_sums(self._s1, self._s2, self.n, self.shift - new)
        self.shift = new.clone()

    @_outside_inference_mode
    def merge(self, other: StreamingCovariance) -> StreamingCovariance:
        """Add ``other``'s rows into ``self`` exactly (its sums re-expressed to ``self``'s shift); returns ``self``."""
        if not isinstance(other, StreamingCovariance):
            raise TypeError(f"merge: expected StreamingCovariance, got {type(other).__name__}")
        if other.dim != self.dim:
            raise ValueError(f"merge: dimension mismatch, self has dim {self.dim}, other has dim {other.dim}")
        self.n_nonfinite += other.n_nonfinite
        if other.n == 0 or other.shift is None:
            return self
        o_shift = other.shift.to(self.device)
        o_s1 = other._s1.to(self.device)
        o_s2 = other._s2.to(self.device)
        if self.n == 0 or self.shift is None:
            self.shift = o_shift.clone()
            self._s1 = o_s1.clone()
            self._s2 = o_s2.clone()
        else:
            s1, s2 = _shifted_sums(o_s1, o_s2, other.n, o_shift - self.shift)
            self._s1 += s1
            self._s2 += s2
        self.n += other.n
        return self

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, as CPU tensors and plain Python values."""
        return {
            "version": _STATE_VERSION,
            "dim": self.dim,
            "gram_dtype": _GRAM_DTYPES[self.gram_dtype],
            "n": int(self.n),
            "n_nonfinite": int(self.n_nonfinite),
            "shift": None if self.shift is None else self.shift.detach().cpu().clone(),
            "sum": self._s1.detach().cpu().clone(),
            "sum_outer": self._s2.detach().cpu().clone(),
        }

    @_outside_inference_mode
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict` onto this accumulator's device; another dimension is an error."""
        dim = int(state.get("dim", self.dim))
        if dim != self.dim:
            raise ValueError(f"load_state_dict: state has dim {dim}, accumulator has dim {self.dim}")
        s1 = torch.as_tensor(state.get("sum", torch.zeros(dim)), dtype=torch.float64)
        s2 = torch.as_tensor(state.get("sum_outer", torch.zeros(dim, dim)), dtype=torch.float64)
        if tuple(s1.shape) != (dim,) or tuple(s2.shape) != (dim, dim):
            raise ValueError(
                f"load_state_dict: expected sum ({dim},) and sum_outer ({dim}, {dim}), "
                f"got {tuple(s1.shape)} and {tuple(s2.shape)}"
            )
        shift = state.get("shift")
        self.n = int(state.get("n", 0))
        self.n_nonfinite = int(state.get("n_nonfinite", 0))
        self.shift = None if shift is None else torch.as_tensor(shift, dtype=torch.float64).to(self.device).clone()
        self._s1 = s1.to(self.device).clone()
        self._s2 = s2.to(self.device).clone()

    # ------------------------------------------------------------------ collectives
    @property
    def packed_size(self) -> int:
        """Length of the packed state (`pack_into`): ``2 + D + D^2``."""
        return 2 + self.dim + self.dim * self.dim

    def pack_into(self, out: torch.Tensor) -> None:
        """Write ``[n, n_nonfinite, S1, S2.flatten()]`` (float64) into ``out``; the shift is not packed."""
        d = self.dim
        out[0], out[1] = float(self.n), float(self.n_nonfinite)
        out[2 : 2 + d].copy_(self._s1)
        out[2 + d :].view(d, d).copy_(self._s2)

    @_outside_inference_mode
    def unpack_(self, flat: torch.Tensor, *, copy: bool = True) -> None:
        """Overwrite counts and sums from a summed packed state; ``copy=False`` makes them views of ``flat``, saving one
        full state at the reduction's peak (170 MB for 15 x 384 points at 10 groups)."""
        flat = torch.as_tensor(flat)
        if flat.ndim != 1 or flat.numel() != self.packed_size:
            raise ValueError(
                f"unpack_: expected a 1-D tensor of length {self.packed_size}, got shape {tuple(flat.shape)}"
            )
        flat = flat.to(device=self.device, dtype=torch.float64)
        counts = flat[:2].tolist()
        self.n = round(counts[0])
        self.n_nonfinite = round(counts[1])
        d = self.dim
        self._s1 = flat[2 : 2 + d].clone() if copy else flat[2 : 2 + d]
        self._s2 = flat[2 + d :].reshape(d, d).clone() if copy else flat[2 + d :].view(d, d)
        if self.n > 0 and self.shift is None:
            self.shift = torch.zeros(d, dtype=torch.float64, device=self.device)


class Summable(Protocol):
    """State that travels in the second collective of `allreduce_accumulators` next to the covariance sums."""

    @property
    def packed_size(self) -> int: ...

    def pack_into(self, out: torch.Tensor) -> None: ...

    def unpack_(self, flat: torch.Tensor, *, copy: bool = ...) -> None: ...


def allreduce_accumulators(
    accs: Sequence[StreamingCovariance],
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    extras: Sequence[Summable] = (),
    *,
    device: torch.device | str | None = None,
) -> None:
    """Combine every rank's accumulators in place with exactly two sum collectives, whatever the local data.

    First the common shift ``sum(n_r shift_r) / sum(n_r)``, then one packed state tensor; ``extras`` (the families'
    float64 states) ride in the second, also without accumulators. Every rank passes the same points in the same order.
    """
    accs, extras = list(accs), list(extras)
    if not accs and not extras:
        return  # every rank has the same (empty) lists, so every rank skips both collectives consistently
    device = accs[0].device if accs else torch.device(device if device is not None else "cpu")
    if any(acc.device != device for acc in accs):
        devices = sorted({str(a.device) for a in accs})
        raise ValueError(f"allreduce_accumulators: accumulators on several devices {devices}")

    # (1) agree on one shift per point
    parts = []
    for acc in accs:
        count = torch.tensor([float(acc.n)], dtype=torch.float64, device=device)
        if acc.n > 0 and acc.shift is not None:
            weighted = acc.shift * float(acc.n)
        else:
            weighted = torch.zeros(acc.dim, dtype=torch.float64, device=device)
        parts.append(torch.cat([count, weighted]))
    total = all_reduce_sum(torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=device))
    offset = 0
    for acc in accs:
        n_all = float(total[offset].item())
        weighted_sum = total[offset + 1 : offset + 1 + acc.dim]
        offset += 1 + acc.dim
        common = weighted_sum / n_all if n_all > 0 else torch.zeros_like(weighted_sum)
        acc.reshift(common)

    # (2) one sum of all packed states
    # One buffer written in place (no per-point packs and no concatenation: at the peak the reduction holds the
    # states plus one buffer, ~1x the state extra instead of ~2x), then unpacked as views of the summed buffer.
    summables: list[Summable] = [*accs, *extras]
    bounds = [0, *itertools.accumulate(part.packed_size for part in summables)]
    packed = torch.empty(bounds[-1], dtype=torch.float64, device=device)
    for part, (lo, hi) in zip(summables, itertools.pairwise(bounds), strict=True):
        part.pack_into(packed[lo:hi])
    summed = all_reduce_sum(packed)
    if summed.dtype != torch.float64 or summed.device != device:
        summed = summed.to(device=device, dtype=torch.float64)
    for part, (lo, hi) in zip(summables, itertools.pairwise(bounds), strict=True):
        part.unpack_(summed[lo:hi], copy=False)  # the buffer is ours: views, no copy
