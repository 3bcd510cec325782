"""Curvature of the training loss: the Hessian's top eigenvalues, its trace and Adam's preconditioned sharpness.

Everything works through Hessian-vector products on one fixed batch (`HessianOperator`): the top eigenvalues by Lanczos
(`lanczos`), the trace by Hutchinson's probes, probe ``i`` drawn from ``default_rng([seed, i])`` alone so any rank
computes any probe with the same bits, and Adam's sharpness against its edge of stability (Cohen et al. 2022). The
caller's module, its flags and every ``.grad`` stay as they were. Formulas and references: docs/observables.md section
11."""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal
from torch import nn

__all__ = [
    "LOSS_ARRAY",
    "HessianOperator",
    "LanczosResult",
    "Preconditioner",
    "TrainingLoss",
    "adam_preconditioner",
    "curvature_batch_indices",
    "hutchinson_samples",
    "lanczos",
    "load_batch",
    "loss_label",
    "offline_loss",
    "rademacher_probe",
    "read_loss_label",
    "say_undeclared",
    "stability_threshold",
    "trace_estimate",
    "training_loss",
    "unfused_eval",
]

MatVec = Callable[[np.ndarray], np.ndarray]
"""``v -> A v`` on float64 vectors of the operator's dimension."""


# ----------------------------------------------------------------------------------------------------- the batch
def curvature_batch_indices(labels: Sequence[int] | np.ndarray, images: int, seed: int) -> np.ndarray:
    """The first ``images`` positions of a class-stratified, seeded order: each class shuffled, then the classes dealt
    round robin, so any prefix holds the classes evenly; a function of labels and seed alone (same batch on every rank).
    """
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    rng = np.random.default_rng(seed)
    per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    order = [int(c[i]) for i in range(max((c.size for c in per_class), default=0)) for c in per_class if i < c.size]
    return np.asarray(order[: max(int(images), 0)], dtype=np.int64)


def load_batch(dataset: Any, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images [B, ...], labels [B])`` of the dataset's items at ``indices`` (``(image, label)`` items)."""
    items = [dataset[int(i)] for i in indices]
    images = torch.stack([torch.as_tensor(item[0]) for item in items])
    labels = torch.as_tensor([int(item[1]) for item in items], dtype=torch.int64)
    return images, labels


# ----------------------------------------------------------------------------------------------------- the loss
LOSS_ARRAY = "curvature_loss"
"""The array that records which loss the curvature was measured on (`loss_label`, `read_loss_label`)."""

_LABEL_CHARS = 200


@dataclass(frozen=True)
class TrainingLoss:
    """The loss whose Hessian is measured, and the words the record keeps about it (the loss protocol).

    A LightningModule declares its training objective as ``tgo_loss(logits, labels) -> scalar``, a batch mean of the
    network's output and the labels alone, and optionally ``tgo_loss_name``; without it plain cross-entropy stands in
    (``declared`` false), and says so."""

    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    name: str
    declared: bool
    module: str = ""

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.fn(logits, labels)


_WARNED_UNDECLARED: set[str] = set()


def training_loss(module: Any, *, warn: bool = False) -> TrainingLoss:
    """The module's ``tgo_loss`` (`TrainingLoss`), else plain cross-entropy (``warn``: say so at once); a ``tgo_loss``
    that is not callable, or a bad ``tgo_loss_name``, is refused."""
    from tgo.errors import UserInputError

    kind = type(module).__name__
    fn = getattr(module, "tgo_loss", None)
    if fn is None:
        loss = TrainingLoss(nn.functional.cross_entropy, f"cross_entropy ({kind} defines no tgo_loss)", False, kind)
        if warn:
            say_undeclared(loss)
        return loss
    if not callable(fn):
        raise UserInputError(
            f"{kind}.tgo_loss: expected a method tgo_loss(logits, labels) -> scalar loss, got {type(fn).__name__}"
        )
    name = getattr(module, "tgo_loss_name", None)
    if name is None:
        name = f"{kind}.tgo_loss"
    if not isinstance(name, str) or not name.strip():
        raise UserInputError(f"{kind}.tgo_loss_name: expected a non-empty string naming the loss, got {name!r}")
    return TrainingLoss(fn, name, True, kind)


def say_undeclared(loss: Any) -> None:
    """Says once per module class that plain cross-entropy stands in for a module without ``tgo_loss``."""
    if not isinstance(loss, TrainingLoss) or loss.declared or loss.module in _WARNED_UNDECLARED:
        return
    _WARNED_UNDECLARED.add(loss.module)
    warnings.warn(
        f"[tgo] observation.curvature: {loss.module} defines no tgo_loss(logits, labels), so the curvature is that "
        "of plain cross-entropy, not of your training objective (docs/observables.md, Curvature: the loss)",
        UserWarning,
        stacklevel=3,
    )


def offline_loss() -> TrainingLoss:
    """Plain cross-entropy where there is no training module (``tgo.observe``)."""
    return TrainingLoss(nn.functional.cross_entropy, "cross_entropy (offline: no training module)", False)


def loss_label(loss: Any) -> np.ndarray:
    """The loss's name as ASCII codes, uint8 ``[<= 200]`` (other characters ``?``): the records hold numbers only."""
    name = getattr(loss, "name", None)
    if not isinstance(name, str):
        name = "cross_entropy (no loss given)" if loss is None else getattr(loss, "__qualname__", type(loss).__name__)
    text = name.encode("ascii", errors="replace")[:_LABEL_CHARS]
    return np.frombuffer(text, dtype=np.uint8).copy()


def read_loss_label(array: np.ndarray) -> str:
    """The text of a recorded `LOSS_ARRAY` (`loss_label`)."""
    return bytes(np.asarray(array, dtype=np.uint8).reshape(-1)).decode("ascii", errors="replace")


# ----------------------------------------------------------------------------------------------------- the operator
@contextlib.contextmanager
def unfused_eval(net: nn.Module) -> Iterator[nn.Module]:
    """``net`` in eval mode with ``fused_attn`` off (no double backward on every backend); restored exactly after."""
    modes = [(m, m.training) for m in net.modules()]
    fused = [(m, m.fused_attn) for m in net.modules() if isinstance(getattr(m, "fused_attn", None), bool)]
    try:
        net.eval()
        for m, _ in fused:
            setattr(m, "fused_attn", False)  # noqa: B010 (a plain attribute of timm's Attention)
        yield net
    finally:
        for m, flag in fused:
            setattr(m, "fused_attn", flag)  # noqa: B010
        for m, training in modes:
            m.training = training


class HessianOperator:
    """``v -> H v``: the Hessian of ``loss(net(images), labels)`` over the trainable parameters, at their values now.

    It runs on a copy of the network (cast to ``dtype``, eval mode, attention unfused), so the caller's is not touched.
    The batch is taken in chunks, ``H v = sum_c (n_c / n) H_c v`` (the Hessian of a batch-mean loss), so memory is that
    of one chunk. ``names`` give the order of the flat vectors; ``products`` counts the products so far."""

    def __init__(
        self,
        net: nn.Module,
        images: torch.Tensor,
        labels: torch.Tensor,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        *,
        dtype: torch.dtype = torch.float64,
        batch_size: int = 32,
        device: torch.device | str | None = None,
    ) -> None:
        if images.shape[0] == 0 or images.shape[0] != labels.shape[0]:
            raise ValueError(f"HessianOperator: expected a non-empty batch, got {images.shape[0]} images")
        source = next(net.parameters(), None)
        self.device = torch.device(device) if device is not None else (source.device if source is not None else None)
        with torch.inference_mode(False), torch.no_grad():
            self.model = copy.deepcopy(net).to(device=self.device, dtype=dtype)
        for p in self.model.parameters():
            p.grad = None
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.shapes = [tuple(p.shape) for p in self.params]
        self.dim = int(sum(p.numel() for p in self.params))
        self.dtype = dtype
        self.loss = loss if loss is not None else nn.functional.cross_entropy
        self.images = images.to(device=self.device, dtype=dtype)
        self.labels = labels.to(self.device)
        self.batch_size = max(int(batch_size), 1)
        self.products = 0

    def _split(self, v: np.ndarray) -> list[torch.Tensor]:
        flat = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)).to(device=self.device, dtype=self.dtype)
        return [
            t.view(s) for t, s in zip(torch.split(flat, [math.prod(s) for s in self.shapes]), self.shapes, strict=True)
        ]

    def matvec(self, v: np.ndarray) -> np.ndarray:
        """``H v`` (float64 ``[P]`` in and out; computed in the operator's dtype, summed over chunks in float64)."""
        if v.shape != (self.dim,):
            raise ValueError(f"HessianOperator.matvec: expected a vector of {self.dim}, got shape {v.shape}")
        vs = self._split(v)
        n = self.images.shape[0]
        total = torch.zeros(self.dim, dtype=torch.float64, device=self.device)
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode(False))
            stack.enter_context(torch.enable_grad())
            stack.enter_context(torch.autocast(self.images.device.type, enabled=False))
            stack.enter_context(unfused_eval(self.model))
            for start in range(0, n, self.batch_size):
                x, y = self.images[start : start + self.batch_size], self.labels[start : start + self.batch_size]
                loss = self.loss(self.model(x), y) * (x.shape[0] / n)
                grads = torch.autograd.grad(loss, self.params, create_graph=True, allow_unused=True)
                live = [(i, g) for i, g in enumerate(grads) if g is not None and g.requires_grad]
                if not live:
                    continue
                hv = torch.autograd.grad(
                    [g for _, g in live],
                    self.params,
                    grad_outputs=[vs[i] for i, _ in live],
                    allow_unused=True,
                )
                total += torch.cat(
                    [
                        (h if h is not None else torch.zeros_like(p)).reshape(-1)
                        for h, p in zip(hv, self.params, strict=True)
                    ]
                ).to(torch.float64)
        self.products += 1
        return total.cpu().numpy()


# ----------------------------------------------------------------------------------------------------- Lanczos
def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``a . b`` by numpy's own loop, not a threaded BLAS whose sum order depends on the thread count: a rank's Lanczos
    and probes must give another rank's bits whatever its cores."""
    return float(np.einsum("i,i->", a, b))


@dataclass(frozen=True)
class LanczosResult:
    """The top Ritz values, decreasing, with their residuals ``||A y_i - theta_i y_i||`` (a bound on the distance to an
    eigenvalue of ``A`` where ``matvec`` is ``A`` to round-off, not on the error of ``matvec`` itself)."""

    eigenvalues: np.ndarray
    residuals: np.ndarray
    steps: int
    converged: bool


def lanczos(matvec: MatVec, dim: int, *, k: int, iterations: int, tol: float, seed: int) -> LanczosResult:
    """The ``k`` largest eigenvalues of a symmetric operator by Lanczos with full reorthogonalisation.

    Every new vector is orthogonalised against the whole basis twice (the second pass removes what round-off left), so
    no ghost copies of converged eigenvalues appear and ``beta_j |s_{j,i}|`` is a Ritz pair's true residual; it stops
    once the top ``k`` residuals are ``<= tol * |theta_1|``. Memory: ``(steps + 1) * dim`` float64."""
    if dim < 1 or k < 1:
        raise ValueError(f"lanczos: expected dim >= 1 and k >= 1, got dim {dim}, k {k}")
    k, steps_max = min(k, dim), min(max(iterations, k), dim)
    basis = np.zeros((steps_max + 1, dim), dtype=np.float64)
    q = np.random.default_rng(seed).standard_normal(dim)
    basis[0] = q / math.sqrt(_dot(q, q))
    alphas: list[float] = []
    betas: list[float] = []
    theta, residuals = np.full(k, np.nan), np.full(k, np.nan)
    converged = False
    for j in range(steps_max):
        w = np.asarray(matvec(basis[j]), dtype=np.float64)
        alphas.append(_dot(basis[j], w))
        for _ in range(2):
            w = w - np.einsum("ki,k->i", basis[: j + 1], np.einsum("ki,i->k", basis[: j + 1], w))
        beta = math.sqrt(_dot(w, w))
        values, vectors = eigh_tridiagonal(np.asarray(alphas), np.asarray(betas)) if j else (np.asarray(alphas), None)
        top = np.argsort(values)[::-1][:k]
        theta = np.full(k, np.nan)
        theta[: top.size] = values[top]
        last_row = vectors[-1, top] if vectors is not None else np.ones(1)
        residuals = np.full(k, np.nan)
        residuals[: top.size] = beta * np.abs(last_row)
        scale = abs(theta[0]) if np.isfinite(theta[0]) and theta[0] != 0 else 1.0
        invariant = beta <= 1e-13 * max(scale, float(np.max(np.abs(alphas))))
        if top.size == k and bool(np.all(residuals <= tol * scale)):
            converged = True
            break
        if invariant or j + 1 == steps_max:
            converged = top.size == k and bool(np.all(residuals <= tol * scale))
            break
        betas.append(beta)
        basis[j + 1] = w / beta
    return LanczosResult(theta, residuals, len(alphas), converged)


# ----------------------------------------------------------------------------------------------------- Hutchinson
def rademacher_probe(dim: int, seed: int, index: int) -> np.ndarray:
    """Probe ``index``: float64 ``[dim]`` of independent +-1, from ``numpy.random.default_rng([seed, index])``."""
    return np.random.default_rng([int(seed), int(index)]).integers(0, 2, size=dim).astype(np.float64) * 2.0 - 1.0


def hutchinson_samples(matvec: MatVec, dim: int, probes: Sequence[int], seed: int) -> np.ndarray:
    """``z_i^T A z_i`` for the Rademacher probes ``i`` in ``probes`` (`rademacher_probe`), float64 in their order."""
    out = np.empty(len(probes), dtype=np.float64)
    for j, i in enumerate(probes):
        z = rademacher_probe(dim, seed, i)
        out[j] = _dot(z, np.asarray(matvec(z), dtype=np.float64))
    return out


def trace_estimate(samples: np.ndarray) -> tuple[float, float]:
    """Hutchinson's ``(tr A, its standard error)``: the samples' mean and ``std(ddof=1) / sqrt(m)`` (NaN below 2)."""
    s = np.asarray(samples, dtype=np.float64)
    if s.size == 0:
        return math.nan, math.nan
    se = float(np.std(s, ddof=1) / math.sqrt(s.size)) if s.size >= 2 else math.nan
    return float(np.mean(s)), se


# ----------------------------------------------------------------------------------------------------- optimizers
@dataclass(frozen=True)
class Preconditioner:
    """An optimizer's stability reference: the diagonal ``P`` of its frozen update (``None``: identity or unknown) and
    the threshold on ``lambda_1(P^-1 H)``; ``reason`` says why there is none."""

    diagonal: np.ndarray | None
    threshold: float
    kind: str
    reason: str = ""


def stability_threshold(beta1: float, learning_rate: float) -> float:
    """``(2 + 2 beta_1) / ((1 - beta_1) eta)``: the edge of stability of Adam's frozen-preconditioner update (Cohen et
    al. 2022), ``2 / eta`` for gradient descent; NaN for a learning rate or ``beta_1`` out of range."""
    if not (math.isfinite(learning_rate) and learning_rate > 0 and 0 <= beta1 < 1):
        return math.nan
    return (2.0 + 2.0 * beta1) / ((1.0 - beta1) * learning_rate)


def adam_preconditioner(optimizer: Any, params: Sequence[nn.Parameter], learning_rate: float) -> Preconditioner:
    """The stability reference of ``optimizer`` for the Hessian over ``params`` (in the Hessian's order).

    Adam / AdamW: ``P = (1 - beta_1^t) diag(sqrt(v_t / (1 - beta_2^t)) + eps)``; plain SGD: ``P = I``. Anything else
    (momentum, other optimizers, no Adam state yet, groups differing in learning rate or ``beta_1``) gives no reference,
    with the reason."""
    opt = getattr(optimizer, "_optimizer", optimizer)  # the torch optimizer inside a LightningOptimizer
    if opt is None:
        return Preconditioner(None, math.nan, "none", "no optimizer (offline observation)")
    groups = {id(p): g for g in getattr(opt, "param_groups", ()) for p in g["params"]}
    mine = [groups.get(id(p)) for p in params]
    if any(g is None for g in mine):
        return Preconditioner(None, math.nan, "none", "a trainable parameter is in none of the optimizer's groups")
    if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        firsts = {(float(g["lr"]), float(g["betas"][0])) for g in mine}  # type: ignore[index]
        if len(firsts) != 1:
            return Preconditioner(None, math.nan, "none", f"parameter groups differ in (lr, beta1): {sorted(firsts)}")
        beta1 = float(mine[0]["betas"][0])  # type: ignore[index]
        parts = []
        for p, g in zip(params, mine, strict=True):
            state = opt.state.get(p, {})
            v = state.get("max_exp_avg_sq" if g.get("amsgrad", False) else "exp_avg_sq")  # type: ignore[union-attr]
            if v is None or "step" not in state:
                return Preconditioner(None, math.nan, "none", "Adam has no second moments yet (no step taken)")
            t = float(state["step"])
            b1, b2 = (float(b) for b in g["betas"])  # type: ignore[index]
            v64 = v.detach().to(torch.float64).reshape(-1).cpu()
            parts.append((1.0 - b1**t) * (torch.sqrt(v64) / math.sqrt(1.0 - b2**t) + float(g["eps"])))  # type: ignore[index]
        diagonal = torch.cat(parts).numpy() if parts else np.zeros(0)
        return Preconditioner(diagonal, stability_threshold(beta1, learning_rate), "adam")
    if type(opt) is torch.optim.SGD:
        if any(float(g.get("momentum", 0.0)) != 0.0 for g in mine):  # type: ignore[union-attr]
            return Preconditioner(None, math.nan, "none", "SGD with momentum (no reference implemented)")
        return Preconditioner(None, stability_threshold(0.0, learning_rate), "sgd")
    return Preconditioner(None, math.nan, "none", f"{type(opt).__name__} has no edge-of-stability reference here")
