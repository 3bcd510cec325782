"""Exact streaming attention geometry: entropy, sink and self mass, peak weight, distance, head diversity, the
largest logit per head, and the spectral norm of each head's query-key form.

timm's fused attention never materialises the attention weights, so they are recomputed from the ``q`` and ``k``
that enter the product (``A = softmax(q k^T / sqrt(d_h))`` per image and head) in float64 (default) or float32, one
chunk of images at a time, and reduced at once to per-image sums. The state is plain float64 *sums* per jackknife
group (counts included), so ranks combine with one sum collective (the `Summable` protocol of
`allreduce_accumulators`) and every metric is a ratio of sums, recomputed without group ``g`` for the delete-a-group
jackknife (`tgo.spectral.jackknife`). The largest logit is a maximum per group, carried by the same collective in
rank slots (`LogitMaxima`). The token layout, the formulas, the softmax evaluated with one exponential per
weight and no ``log(0)`` (`_image_sums`), ranges and known answers: ``docs/observables.md``, "7. Attention geometry".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tgo.spectral.accumulator import _outside_inference_mode, strict_fp32_math
from tgo.spectral.jackknife import jackknife_stderr, runs_of

__all__ = [
    "ATTENTION_METRICS",
    "HEAD_METRICS",
    "AttentionAccumulator",
    "AttentionSummary",
    "LogitMaxima",
    "Workspace",
    "max_logit_summary",
    "patch_distances",
    "qk_spectral_norms",
]

_STATE_VERSION = 1

HEAD_METRICS: tuple[str, ...] = (
    "attention_entropy",
    "attention_entropy_normalized",
    "cls_attention_entropy",
    "cls_attention_entropy_normalized",
    "cls_mass",
    "register_mass",
    "self_mass",
    "max_weight",
    "mean_attention_distance",
)
"""Metrics defined per head (``AttentionSummary.per_head[name]`` is ``[H]``; ``values[name]`` is the head mean)."""

ATTENTION_METRICS: tuple[str, ...] = (*HEAD_METRICS, "effective_heads", "mean_head_similarity")
"""Every scalar of `AttentionSummary.values` (head means, then the two head-diversity scalars)."""

# Per-head sums in the state row, in this order, after [n_images, n_nonfinite]; then the H x H Gram.
_SUMS = ("entropy", "cls_entropy", "cls_mass", "register_mass", "self_mass", "max_weight", "distance")


def patch_distances(grid: tuple[int, int], patch_size: int | tuple[int, int]) -> np.ndarray:
    """Pixel distances between the centres of all patch pairs of an ``(h, w)`` grid, float64 ``[h w, h w]``:
    ``D[p, q] = sqrt((ph (r_p - r_q))^2 + (pw (c_p - c_q))^2)`` with ``p = r_p w + c_p`` (patches row-major)."""
    h, w = grid
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    rows, cols = np.divmod(np.arange(h * w), w)
    dr = (rows[:, None] - rows[None, :]) * float(ph)
    dc = (cols[:, None] - cols[None, :]) * float(pw)
    return np.sqrt(dr * dr + dc * dc)


@dataclass(frozen=True)
class AttentionSummary:
    """The attention metrics of one observation point, with delete-a-group jackknife errors.

    Attributes:
        values: ``{metric: value}`` for every name of `ATTENTION_METRICS` (head means of the `HEAD_METRICS`).
        stderr: ``{metric: jackknife standard error}``; NaN without groups (``groups < 2``).
        replicates: ``{metric: [G] leave-one-group-out values}`` (``[0]`` without groups), for paired errors.
        per_head: ``{metric: [H]}`` for the `HEAD_METRICS`.
        per_head_stderr: ``{metric: [H]}`` standard errors.
        per_head_replicates: ``{metric: [G, H]}``.
        similarity: ``[H, H]`` cosine similarity of the heads' attention maps (NaN without images).
        reference: ``{metric: value under uniform attention}`` (q = 0: every weight ``1/N``), the noise reference:
            ``log N`` for the entropies, 1 for their normalised forms, ``1/N`` for ``cls_mass``, ``self_mass`` and
            ``max_weight``, ``R/N`` for ``register_mass`` (``R`` registers), the mean pairwise patch distance for
            ``mean_attention_distance``, 1 for ``effective_heads`` and ``mean_head_similarity`` (identical heads).
        n_images: Images whose attention entered the sums.
        n_nonfinite: Images dropped because their ``q``/``k`` made a metric non-finite.
        groups: Jackknife groups ``G`` (0: none).
    """

    values: dict[str, float]
    stderr: dict[str, float]
    replicates: dict[str, np.ndarray]
    per_head: dict[str, np.ndarray]
    per_head_stderr: dict[str, np.ndarray]
    per_head_replicates: dict[str, np.ndarray]
    similarity: np.ndarray
    reference: dict[str, float]
    n_images: int
    n_nonfinite: int
    groups: int = field(default=0)


class Workspace:
    """Reused buffers for the recomputed logits and weights (megabytes per chunk), so a pass does not allocate them
    afresh for every chunk of every block: fresh multi-megabyte allocations are mapped and zero-filled by the kernel
    page by page, which measured as much as the logit product itself on a CPU. One workspace may serve every
    accumulator of an observation (they update one after another); `AttentionState` shares one, freed with it."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A contiguous ``shape`` tensor of uninitialised values, the same memory at every call with ``name``."""
        size = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.dtype != dtype or buf.device != device or buf.numel() < size:
            buf = self._buffers[name] = torch.empty(size, dtype=dtype, device=device)
        return buf[:size].view(*shape)

    def clear(self) -> None:
        """Frees every buffer (a later `take` allocates again)."""
        self._buffers.clear()


class AttentionAccumulator:
    """Streaming sums of the attention geometry of one attention layer, per jackknife group.

    Args:
        num_heads: ``H``.
        num_tokens: ``N = num_prefix_tokens + h * w`` (checked).
        num_prefix_tokens: Tokens before the patches (class token and registers), ``>= 0``.
        grid: ``(h, w)`` patches, row-major in the sequence.
        patch_size: Patch side in pixels (or ``(height, width)``), for distances in pixels.
        groups: Jackknife groups ``G`` (0: one group, no standard errors). With ``G >= 1`` every `update` needs the
            ``[B]`` group ids of its images.
        class_token: Whether token 0 is a class token; defaults to ``num_prefix_tokens >= 1`` (timm puts CLS first).
            Pass ``False`` for a model with registers but no class token (``class_token=False, reg_tokens=R``).
        compute_dtype: ``torch.float64`` (default, exact to ~1e-15) or ``torch.float32`` for the recomputed logits
            and weights; sums are float64 either way.
        chunk_elements: At most this many attention weights (``images x H x N x N``) are held at once; the batch is
            processed in chunks of whole images. Default: 2^20 on CPU (8 MiB per float64 temporary, 4 images at
            ViT-S/16 224 px: measured ~2x faster than 32 MiB chunks, which glibc maps afresh on every allocation and
            which fall out of cache), 2^24 on a GPU.
        device: Where the state lives and the recomputation runs (CPU by default); ``q``/``k`` are moved there.
    """

    @_outside_inference_mode
    def __init__(
        self,
        num_heads: int,
        num_tokens: int,
        num_prefix_tokens: int,
        grid: tuple[int, int] | Sequence[int],
        patch_size: int | tuple[int, int] | Sequence[int],
        groups: int = 0,
        *,
        class_token: bool | None = None,
        compute_dtype: torch.dtype = torch.float64,
        chunk_elements: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        def positive(name: str, value: Any, minimum: int = 1) -> int:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
                raise ValueError(f"AttentionAccumulator: {name} must be an int >= {minimum}, got {value!r}")
            return int(value)

        self.num_heads = positive("num_heads", num_heads)
        self.num_tokens = positive("num_tokens", num_tokens)
        self.num_prefix_tokens = positive("num_prefix_tokens", num_prefix_tokens, 0)
        cells = tuple(grid)
        if len(cells) != 2:
            raise ValueError(f"AttentionAccumulator: grid must be (h, w), got {grid!r}")
        self.grid: tuple[int, int] = (positive("grid[0]", cells[0]), positive("grid[1]", cells[1]))
        sizes = (patch_size, patch_size) if isinstance(patch_size, (int, np.integer)) else tuple(patch_size)
        if len(sizes) != 2:
            raise ValueError(f"AttentionAccumulator: patch_size must be an int or (height, width), got {patch_size!r}")
        self.patch_size: tuple[int, int] = (positive("patch_size", sizes[0]), positive("patch_size", sizes[1]))
        self.num_patches = self.grid[0] * self.grid[1]
        if self.num_tokens != self.num_prefix_tokens + self.num_patches:
            raise ValueError(
                f"AttentionAccumulator: num_tokens {self.num_tokens} != num_prefix_tokens {self.num_prefix_tokens}"
                f" + h*w {self.grid[0]}*{self.grid[1]}"
            )
        self.groups = positive("groups", groups, 0)
        self.class_token = self.num_prefix_tokens >= 1 if class_token is None else bool(class_token)
        if self.class_token and self.num_prefix_tokens < 1:
            raise ValueError("AttentionAccumulator: class_token=True needs num_prefix_tokens >= 1")
        self.num_registers = self.num_prefix_tokens - int(self.class_token)
        if compute_dtype not in (torch.float64, torch.float32):
            raise ValueError(f"AttentionAccumulator: compute_dtype must be float64 or float32, got {compute_dtype!r}")
        self.compute_dtype = compute_dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        default_chunk = 2**20 if self.device.type == "cpu" else 2**24
        self.chunk_elements = positive("chunk_elements", default_chunk if chunk_elements is None else chunk_elements)
        h = self.num_heads
        self.row_size = 2 + len(_SUMS) * h + h * h
        self._state = torch.zeros(max(self.groups, 1), self.row_size, dtype=torch.float64, device=self.device)
        # per group and head, the largest scaled logit of a finite image (-inf: none yet); a max, not a sum, so it
        # travels in the sum collective through `LogitMaxima`'s rank slots, not in ``_state``
        self.logit_max = torch.full(
            (max(self.groups, 1), self.num_heads), -math.inf, dtype=torch.float64, device=self.device
        )
        self._distances = torch.from_numpy(patch_distances(self.grid, self.patch_size)).to(
            device=self.device, dtype=compute_dtype
        )
        self.workspace = Workspace()  # `AttentionState` gives every block of an observation the same one

    def __repr__(self) -> str:
        return (
            f"AttentionAccumulator(num_heads={self.num_heads}, num_tokens={self.num_tokens}, "
            f"num_prefix_tokens={self.num_prefix_tokens}, grid={self.grid}, groups={self.groups}, "
            f"n_images={self.n_images}, n_nonfinite={self.n_nonfinite})"
        )

    @property
    def n_images(self) -> int:
        """Images in the sums, all groups."""
        return round(float(self._state[:, 0].sum().item()))

    @property
    def n_nonfinite(self) -> int:
        """Images dropped for non-finite metrics, all groups."""
        return round(float(self._state[:, 1].sum().item()))

    # ------------------------------------------------------------------ streaming
    @_outside_inference_mode
    def update(
        self, q: torch.Tensor, k: torch.Tensor, batch_groups: torch.Tensor | Sequence[int] | None = None
    ) -> None:
        """Add one batch: recompute its attention weights and add every image's sums to its group.

        Images whose metrics come out non-finite (NaN/Inf in ``q`` or ``k``) are dropped and counted in
        ``n_nonfinite``. ``q`` and ``k``: after ``q_norm`` / ``k_norm``, ``[B, H, N, d_h]``, any floating dtype and
        device; ``batch_groups``: ``[B]`` jackknife group ids in ``[0, groups)`` (required when ``groups >= 1``,
        refused when ``groups == 0``).
        """
        if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
            raise ValueError(f"AttentionAccumulator.update: q and k must be tensors, got {type(q)}, {type(k)}")
        want = f"[B, {self.num_heads}, {self.num_tokens}, d_h]"
        if q.ndim != 4 or q.shape[1] != self.num_heads or q.shape[2] != self.num_tokens or q.shape[3] < 1:
            raise ValueError(f"AttentionAccumulator.update: expected q of shape {want}, got {tuple(q.shape)}")
        if k.shape != q.shape:
            raise ValueError(f"AttentionAccumulator.update: q {tuple(q.shape)} and k {tuple(k.shape)} differ")
        if not q.is_floating_point() or not k.is_floating_point():
            raise ValueError(f"AttentionAccumulator.update: q and k must be floating point, got {q.dtype}, {k.dtype}")
        b = q.shape[0]
        if self.groups == 0:
            if batch_groups is not None:
                raise ValueError("AttentionAccumulator.update: batch_groups given but the accumulator has groups=0")
            ids = [0] * b
        else:
            if batch_groups is None:
                raise ValueError(f"AttentionAccumulator.update: groups={self.groups} needs batch_groups ([B] ids)")
            ids = [int(g) for g in torch.as_tensor(batch_groups).detach().cpu().reshape(-1).tolist()]
            if len(ids) != b or any(g < 0 or g >= self.groups for g in ids):
                raise ValueError(
                    f"AttentionAccumulator.update: batch_groups must be {b} ids in [0, {self.groups}), got {ids}"
                )
        if b == 0:
            return
        per_chunk = max(1, self.chunk_elements // (self.num_heads * self.num_tokens * self.num_tokens))
        with torch.no_grad(), strict_fp32_math(self.device.type):
            for start in range(0, b, per_chunk):
                stop = min(b, start + per_chunk)
                rows, top = self._image_sums(q[start:stop].detach(), k[start:stop].detach())
                finite = (rows[:, 1] == 0).unsqueeze(1)  # a dropped image's logits enter no maximum
                top = torch.where(finite, top, -math.inf)
                for group, lo, hi in runs_of(ids[start:stop]):
                    self._state[group] += rows[lo:hi].sum(dim=0)
                    self.logit_max[group] = torch.maximum(self.logit_max[group], top[lo:hi].amax(dim=0))

    def _image_sums(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One state row per image, ``[b, row_size]`` float64 (non-finite images become ``[0, 1, 0, ...]``), and each
        image's largest scaled logit per head, ``[b, H]`` float64."""
        cd, p, h = self.compute_dtype, self.num_prefix_tokens, self.num_heads
        b = q.shape[0]
        scale = q.shape[-1] ** -0.5
        take = self.workspace.take
        shape, dev = tuple(q.shape), self.device
        # as timm: (q * scale) @ k^T; q and k made contiguous once, in reused memory
        q = torch.mul(q.to(device=dev, dtype=cd), scale, out=take("q", shape, cd, dev))
        k = take("k", shape, cd, dev).copy_(k)
        n = shape[2]
        logits = torch.matmul(q, k.transpose(-2, -1), out=take("logits", (b, h, n, n), cd, dev))  # [b, H, N, N]
        pre = logits[..., :p]  # prefix keys (not modified below)
        patch = logits[..., p:]
        m = patch.amax(dim=-1, keepdim=True)  # [b, H, N, 1]
        # the largest logit, from the row maxima (a max is exact in any order: no further pass over the logits)
        top = m.amax(dim=(-2, -1))
        top = (torch.maximum(top, pre.amax(dim=(-2, -1))) if p else top).to(torch.float64)
        patch.sub_(m)  # l - m <= 0 on patch keys, in place
        e = torch.exp(patch, out=take("weights", patch.shape, cd, dev))  # [b, H, N, P], max 1 per row
        s = e.sum(dim=-1, keepdim=True)  # >= 1
        # sum_j E (l - m) <= 0: a product into reused memory, then row sums (einsum's batched row dots were 3x slower on
        # CPU, a fresh product 1.7x)
        t = torch.mul(e, patch, out=take("product", e.shape, cd, dev)).sum(dim=-1, keepdim=True)
        log_patch = m + torch.log(s)  # log of the patch block's unnormalised mass
        lse = torch.logsumexp(torch.cat([pre, log_patch], dim=-1), dim=-1, keepdim=True) if p else log_patch
        c = torch.exp(m - lse)  # A = c E on patch keys
        entropy = (-c * (t + (m - lse) * s)).squeeze(-1)  # [b, H, N]
        peak = c.squeeze(-1)
        a_pre = pre  # [b, H, N, 0] without prefix tokens
        if p:
            log_a_pre = pre - lse
            a_pre = torch.exp(log_a_pre)  # [b, H, N, p]
            entropy = entropy - (a_pre * log_a_pre).sum(dim=-1)
            peak = torch.maximum(peak, a_pre.amax(dim=-1))

        f64 = torch.float64
        zeros = torch.zeros(b, h, dtype=f64, device=self.device)
        qp = slice(p, None)  # patch queries
        n_p = self.num_patches
        e_qp = e[:, :, qp]  # [b, H, P, P] (a view)
        ent_sum = entropy[:, :, qp].to(f64).sum(dim=-1)
        ent_cls = entropy[:, :, 0].to(f64) if self.class_token else zeros
        cls_mass = a_pre[:, :, qp, 0].to(f64).sum(dim=-1) if self.class_token else zeros
        reg = slice(int(self.class_token), p)
        reg_mass = a_pre[:, :, qp, reg].to(f64).sum(dim=(-1, -2)) if self.num_registers else zeros
        peak_sum = peak[:, :, qp].to(f64).sum(dim=-1)
        # sum_j E_ij D_ij for every patch query i, the same way (a batched matrix-vector product per query: 6x slower)
        weighted = torch.mul(e_qp, self._distances, out=take("product", e_qp.shape, cd, dev)).sum(dim=-1)  # [b, H, P]
        distance = (weighted / s[:, :, qp, 0]).to(f64).sum(dim=-1)
        e.mul_(c)  # now A on the patch keys (in place: E is not needed any more)
        self_mass = torch.diagonal(e_qp, dim1=-2, dim2=-1).to(f64).sum(dim=-1)
        # Gram of the heads' maps over patch queries and all keys: <A_h, A_h'> = sum_ij A_hij A_h'ij
        a_qp = e_qp.reshape(b, h, n_p * n_p)
        gram = (a_qp @ a_qp.transpose(-2, -1)).to(f64)
        if p:
            a_pre_qp = a_pre[:, :, qp].reshape(b, h, -1)
            gram = gram + (a_pre_qp @ a_pre_qp.transpose(-2, -1)).to(f64)
        ones = torch.ones(b, 1, dtype=f64, device=self.device)
        rows = torch.cat(
            [ones, 0 * ones, ent_sum, ent_cls, cls_mass, reg_mass, self_mass, peak_sum, distance, gram.reshape(b, -1)],
            dim=1,
        )
        bad = torch.zeros(self.row_size, dtype=f64, device=self.device)
        bad[1] = 1.0
        finite = torch.isfinite(rows).all(dim=1, keepdim=True)
        return torch.where(finite, rows, bad), top

    # ------------------------------------------------------------------ collectives (the Summable protocol)
    @property
    def packed_size(self) -> int:
        """Length of the packed state: ``max(G, 1) * (2 + 7 H + H^2)`` float64 numbers."""
        return self._state.numel()

    def pack_into(self, out: torch.Tensor) -> None:
        """Write the flat state into ``out`` (a float64 slice of a larger buffer)."""
        out.copy_(self._state.reshape(-1))

    @_outside_inference_mode
    def unpack_(self, flat: torch.Tensor, *, copy: bool = True) -> None:
        """Overwrite the state with a (summed) packed state (``copy=False``: a view of ``flat``, float64 on this
        device already, instead of a copy)."""
        flat = torch.as_tensor(flat)
        if flat.ndim != 1 or flat.numel() != self.packed_size:
            raise ValueError(
                f"AttentionAccumulator.unpack_: expected a 1-D tensor of length {self.packed_size}, "
                f"got shape {tuple(flat.shape)}"
            )
        flat = flat.to(device=self.device, dtype=torch.float64)
        state = flat.view(self._state.shape)
        self._state = state.clone() if copy else state

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """The sums and the layout they belong to, as CPU tensors and plain values."""
        return {
            "version": _STATE_VERSION,
            "num_heads": self.num_heads,
            "num_tokens": self.num_tokens,
            "num_prefix_tokens": self.num_prefix_tokens,
            "groups": self.groups,
            "sums": self._state.detach().cpu().clone(),
            "logit_max": self.logit_max.detach().cpu().clone(),
        }

    @_outside_inference_mode
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict` (missing sums: empty); a layout mismatch is an error, not a reshape."""
        for key in ("num_heads", "num_tokens", "num_prefix_tokens", "groups"):
            if int(state.get(key, getattr(self, key))) != getattr(self, key):
                raise ValueError(
                    f"AttentionAccumulator.load_state_dict: state has {key}={state[key]}, "
                    f"accumulator {getattr(self, key)}"
                )
        sums = torch.as_tensor(state.get("sums", torch.zeros_like(self._state)), dtype=torch.float64)
        if sums.shape != self._state.shape:
            raise ValueError(
                f"AttentionAccumulator.load_state_dict: sums of shape {tuple(sums.shape)}, "
                f"expected {tuple(self._state.shape)}"
            )
        self._state = sums.to(self.device).clone()
        top = torch.as_tensor(state.get("logit_max", torch.full_like(self.logit_max, -math.inf)), dtype=torch.float64)
        if top.shape != self.logit_max.shape:
            raise ValueError(
                f"AttentionAccumulator.load_state_dict: logit_max of shape {tuple(top.shape)}, "
                f"expected {tuple(self.logit_max.shape)}"
            )
        self.logit_max = top.to(self.device).clone()

    # ------------------------------------------------------------------ results
    def group_sums(self) -> np.ndarray:
        """The raw per-group sums, float64 ``[max(G, 1), 2 + 7 H + H^2]``."""
        return self._state.detach().cpu().numpy().astype(np.float64, copy=True)

    def reference(self) -> dict[str, float]:
        """Every metric's value under uniform attention (every weight ``1/N``), the noise reference."""
        n = float(self.num_tokens)
        cls = 1.0 if self.class_token else math.nan  # no class token: no CLS query, no sink
        normalized = 1.0 if n > 1 else math.nan
        return {
            "attention_entropy": math.log(n),
            "attention_entropy_normalized": normalized,
            "cls_attention_entropy": cls * math.log(n),
            "cls_attention_entropy_normalized": cls * normalized,
            "cls_mass": cls / n,
            "register_mass": self.num_registers / n if self.num_registers else math.nan,
            "self_mass": 1.0 / n,
            "max_weight": 1.0 / n,
            "mean_attention_distance": float(patch_distances(self.grid, self.patch_size).mean()),
            "effective_heads": 1.0,
            "mean_head_similarity": 1.0 if self.num_heads > 1 else math.nan,
        }

    def _metrics(self, sums: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, float], np.ndarray]:
        """Per-head metrics, diversity scalars and the similarity matrix from one state row (a sum of group rows)."""
        h, n_keys, patches = self.num_heads, self.num_tokens, self.num_patches
        n = sums[0]
        block = {name: sums[2 + i * h : 2 + (i + 1) * h] for i, name in enumerate(_SUMS)}
        gram = sums[2 + len(_SUMS) * h :].reshape(h, h)
        nan = np.full(h, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            per_query = n * patches
            log_n = math.log(n_keys) if n_keys > 1 else math.nan
            entropy = block["entropy"] / per_query
            cls_entropy = block["cls_entropy"] / n if self.class_token else nan
            per_head = {
                "attention_entropy": entropy,
                "attention_entropy_normalized": entropy / log_n,
                "cls_attention_entropy": cls_entropy,
                "cls_attention_entropy_normalized": cls_entropy / log_n,
                "cls_mass": block["cls_mass"] / per_query if self.class_token else nan,
                "register_mass": block["register_mass"] / per_query if self.num_registers else nan,
                "self_mass": block["self_mass"] / per_query,
                "max_weight": block["max_weight"] / per_query,
                "mean_attention_distance": block["distance"] / per_query,
            }
            if n <= 0:
                per_head = {name: nan.copy() for name in per_head}
                similarity = np.full((h, h), np.nan)
            else:
                gram = (gram + gram.T) / 2
                norm = np.sqrt(np.diag(gram))
                similarity = gram / np.outer(norm, norm)
            off = ~np.eye(h, dtype=bool)
            diversity = {
                "effective_heads": float(np.trace(similarity) ** 2 / np.sum(similarity * similarity)),
                "mean_head_similarity": float(similarity[off].mean()) if h > 1 else math.nan,
            }
        return per_head, diversity, similarity

    def summary(self) -> AttentionSummary:
        """Every metric of the (reduced) state, with its delete-a-group jackknife standard error.

        Values come from the total over groups; replicate ``g`` is the same ratio of sums with group ``g``'s sums
        left out (the sum of the other groups' rows, so no subtraction), and ``stderr = jackknife_stderr(replicates)``.
        """
        sums = self.group_sums()
        per_head, diversity, similarity = self._metrics(sums.sum(axis=0))
        g = self.groups
        rep_head: dict[str, list[np.ndarray]] = {name: [] for name in HEAD_METRICS}
        rep_div: dict[str, list[float]] = {name: [] for name in diversity}
        for left_out in range(g):
            loo_head, loo_div, _ = self._metrics(np.delete(sums, left_out, axis=0).sum(axis=0))
            for name in HEAD_METRICS:
                rep_head[name].append(loo_head[name])
            for name in diversity:
                rep_div[name].append(loo_div[name])
        h = self.num_heads
        per_head_replicates = {name: np.asarray(rep_head[name], dtype=np.float64).reshape(g, h) for name in rep_head}
        replicates = {name: per_head_replicates[name].mean(axis=1) for name in HEAD_METRICS}
        replicates.update({name: np.asarray(rep_div[name], dtype=np.float64) for name in rep_div})
        values = {name: float(per_head[name].mean()) for name in HEAD_METRICS}
        values.update(diversity)
        return AttentionSummary(
            values=values,
            stderr={name: jackknife_stderr(replicates[name]) for name in ATTENTION_METRICS},
            replicates=replicates,
            per_head=per_head,
            per_head_stderr={
                name: np.array([jackknife_stderr(reps[:, i]) for i in range(h)])
                for name, reps in per_head_replicates.items()
            },
            per_head_replicates=per_head_replicates,
            similarity=similarity,
            reference=self.reference(),
            n_images=round(float(sums[:, 0].sum())),
            n_nonfinite=round(float(sums[:, 1].sum())),
            groups=g,
        )


# ----------------------------------------------------------------------------------------------- the largest logit
class LogitMaxima:
    """The accumulators' per-group logit maxima as a `Summable`: a maximum carried by the sum collective.

    A maximum is not a sum, and a third (MAX) collective would cost a round trip per observation. Rank ``r`` writes
    its maxima into slot ``r`` of a ``[W, 2, K]`` zero buffer (``K`` = every accumulator's ``G x H`` values): row 0
    the values where the rank saw an image of that group (0 elsewhere), row 1 a 0/1 presence mask. The sum
    collective adds each slot to zeros only, so every slot arrives exact, and `unpack_` takes the maximum over the
    slots that are present. The price is ``2 W K`` float64 numbers (W = 8, 12 blocks, G = 10, H = 6: 92 KiB).
    """

    def __init__(self, accumulators: Sequence[AttentionAccumulator], rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"LogitMaxima: rank {rank} outside [0, {world_size})")
        self.accumulators = list(accumulators)
        self.rank, self.world_size = int(rank), int(world_size)
        self._sizes = [acc.logit_max.numel() for acc in self.accumulators]

    @property
    def packed_size(self) -> int:
        """``2 W K`` float64 numbers."""
        return 2 * self.world_size * sum(self._sizes)

    def pack_into(self, out: torch.Tensor) -> None:
        """Zeros, then this rank's values and presence mask in its slot."""
        out.zero_()
        if not self._sizes:
            return
        local = torch.cat([acc.logit_max.reshape(-1) for acc in self.accumulators]).to(out.device, torch.float64)
        present = torch.isfinite(local)
        slot = out.view(self.world_size, 2, -1)[self.rank]
        slot[0] = torch.where(present, local, 0.0)
        slot[1] = present.to(torch.float64)

    def unpack_(self, flat: torch.Tensor, *, copy: bool = True) -> None:
        """Every accumulator's maxima become the maxima over all ranks' slots (-inf where no rank saw an image)."""
        if flat.numel() != self.packed_size:
            raise ValueError(f"LogitMaxima.unpack_: expected {self.packed_size} numbers, got {flat.numel()}")
        if not self._sizes:
            return
        slots = flat.reshape(self.world_size, 2, -1)
        values = torch.where(slots[:, 1] > 0, slots[:, 0], -math.inf).amax(dim=0)
        for acc, part in zip(self.accumulators, values.split(self._sizes), strict=True):
            acc.logit_max = part.reshape(acc.logit_max.shape).to(acc.device).clone()


def max_logit_summary(group_max: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """The largest scaled logit per head (``[H]``), its maximum over heads, and the leave-one-group-out maxima over
    heads (``[G]``; ``[0]`` with fewer than two groups) from the per-group maxima ``[max(G, 1), H]``.

    NaN where no image was seen. A maximum is not a smooth statistic: its delete-a-group jackknife error (from the
    replicates) is a rough spread of the extreme over the image groups, not a calibrated standard error
    (``docs/observables.md``, "7. Attention geometry").
    """
    group_max = np.asarray(group_max, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        per_head = group_max.max(axis=0)
        per_head[~np.isfinite(per_head)] = np.nan
        g = group_max.shape[0]
        replicates = np.array(
            [np.delete(group_max, left_out, axis=0).max() for left_out in range(g)] if g >= 2 else [], dtype=np.float64
        )
    replicates[~np.isfinite(replicates)] = np.nan
    top = float(np.nanmax(per_head)) if np.any(np.isfinite(per_head)) else math.nan
    return per_head, top, replicates


def qk_spectral_norms(qkv_weight: torch.Tensor, num_heads: int, scale: float) -> np.ndarray:
    """Per head, ``scale * ||W_Q,h^T W_K,h||_2``: the spectral norm of the bilinear form behind the logits
    ``scale * x_i^T W_Q,h^T W_K,h x_j`` (biases and ``q_norm`` / ``k_norm`` aside), float64 ``[H]``.

    Zhai et al. (2023) tie attention-entropy collapse to this norm. ``qkv_weight``: timm's fused ``[3 D, D]`` weight
    (rows: q, k, v, each head's ``d_h`` rows in turn). The ``D x D`` product has rank ``d_h``: with
    ``W_Q,h^T = Q_q R_q`` and ``W_K,h^T = Q_k R_k`` (thin QR, float64), its singular values are those of the
    ``d_h x d_h`` matrix ``R_q R_k^T``.
    """
    w = qkv_weight.detach().to("cpu", torch.float64)
    dim = w.shape[1]
    if w.shape[0] != 3 * dim or dim % num_heads:
        raise ValueError(f"qk_spectral_norms: expected a [3 D, D] qkv weight with D divisible by {num_heads} heads")
    d_h = dim // num_heads
    wq = w[:dim].reshape(num_heads, d_h, dim).transpose(1, 2)  # [H, D, d_h] = W_Q,h^T
    wk = w[dim : 2 * dim].reshape(num_heads, d_h, dim).transpose(1, 2)
    r_q = torch.linalg.qr(wq, mode="r").R
    r_k = torch.linalg.qr(wk, mode="r").R
    return (scale * torch.linalg.matrix_norm(r_q @ r_k.transpose(1, 2), ord=2)).numpy()
