"""Input-output Jacobians of a network's transformer blocks, at fixed images: per-token spectra and the block's norm.

A block maps its input sequence ``X`` (``[T, D]``) to ``Y = f(X)``; its Jacobian is ``T D x T D``, 75,648 square
at ViT-S, too large for exact smallest singular values or log-determinants. Two exact reductions are measured
(`BlockJacobians`, on a float64 eval-mode, attention-unfused copy of the network; the caller's is not touched):

* **per token** (`token_jacobian`): ``J_tt = dy_t / dx_t`` (``D x D``), how one token's output moves with its own
  input, the other tokens held: the map TGO-IV's authors fit per layer. It is dense and exact, row by row from
  reverse-mode products on copies of the sequence (``chunk`` rows per backward), and its singular values give
  ``sigma_max``, ``sigma_min``, ``log |det J_tt| = sum_i log sigma_i`` and the condition number
  (`token_spectrum`);
* **whole sequence** (`sequence_norm`): ``||J||_2`` of the full ``T D`` map, the square root of the top eigenvalue of
  ``J^T J`` by the curvature family's Lanczos (`tgo.optimisation.curvature.lanczos`), each product a Jacobian-vector
  product (double backward) and a vector-Jacobian product.

Formulas, costs and the departures from TGO-IV: ``docs/observables.md``, "Block Jacobians".
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from tgo.optimisation.curvature import lanczos, unfused_eval

Block = Callable[[torch.Tensor], torch.Tensor]
"""A block as a function of its input sequence ``[B, T, D]`` alone (its other arguments bound)."""

__all__ = [
    "Block",
    "BlockJacobians",
    "SequenceNorm",
    "sequence_norm",
    "token_jacobian",
    "token_positions",
    "token_spectrum",
]


def token_positions(tokens: int, count: int) -> list[int]:
    """The ``count`` measured positions of a ``tokens``-long sequence: ``(j T) // count`` for ``j < count`` (token 0,
    the class token where there is one, then evenly through the patches); all of them when ``count >= T``."""
    count = min(int(count), int(tokens))
    return [(j * tokens) // count for j in range(count)]


@contextlib.contextmanager
def _grad_mode(device: torch.device) -> Iterator[None]:
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        yield


def token_jacobian(block: Block, x: torch.Tensor, token: int, *, chunk: int = 64) -> torch.Tensor:
    """``J_tt = d block(x)[t] / d x[t]``, ``[D, D]`` (row ``i``: the gradient of output channel ``i`` of token ``t``).

    ``x`` is one image's block input ``[1, T, D]``; ``chunk`` copies of it go through the block at once, copy ``c``
    carrying the cotangent ``e_i`` on token ``t``'s output, so one backward gives ``chunk`` rows (memory: ``chunk``
    sequences' activations).
    """
    t, d = int(token), x.shape[-1]
    rows = []
    with _grad_mode(x.device):
        for start in range(0, d, max(int(chunk), 1)):
            idx = torch.arange(start, min(start + max(int(chunk), 1), d), device=x.device)
            xs = x.detach().expand(idx.numel(), *x.shape[1:]).clone().requires_grad_(True)
            y = block(xs)
            cot = torch.zeros_like(y)
            cot[torch.arange(idx.numel(), device=x.device), t, idx] = 1.0
            (grad,) = torch.autograd.grad(y, xs, cot)
            rows.append(grad[:, t, :])
    return torch.cat(rows)


def token_spectrum(jacobian: np.ndarray) -> tuple[np.ndarray, float, float, float]:
    """``(singular values descending, sigma_max, sigma_min, log |det J| = sum log sigma_i)`` of a square Jacobian
    (LAPACK's SVD in float64; ``-inf`` where a singular value is 0)."""
    s = np.linalg.svd(np.asarray(jacobian, dtype=np.float64), compute_uv=False)
    with np.errstate(divide="ignore"):
        logdet = float(np.sum(np.log(s)))
    return s, float(s[0]), float(s[-1]), logdet


@dataclass(frozen=True)
class SequenceNorm:
    """``||J||_2`` of a block's whole-sequence Jacobian by Lanczos on ``J^T J``.

    Attributes:
        sigma: ``sqrt(theta_1)``, the top Ritz value's square root.
        residual: ``||J^T J y - theta_1 y||`` (bounds ``theta_1``'s distance to ``sigma_max^2``).
        steps: Lanczos steps (one ``J v`` and one ``J^T w`` each).
    """

    sigma: float
    residual: float
    steps: int


def sequence_norm(block: Block, x: torch.Tensor, *, iterations: int, tol: float, seed: int) -> SequenceNorm:
    """`SequenceNorm` of ``block`` at one image's input ``x`` ``[1, T, D]``: one forward with its graph, then per
    Lanczos step ``J v`` (the gradient of ``u -> J^T u`` at ``u = 0``, by double backward) and ``J^T (J v)``."""
    with _grad_mode(x.device):
        xs = x.detach().clone().requires_grad_(True)
        y = block(xs)
        u = torch.zeros_like(y, requires_grad=True)
        (vjp_u,) = torch.autograd.grad(y, xs, u, create_graph=True)

        def matvec(v: np.ndarray) -> np.ndarray:
            tangent = torch.from_numpy(v).to(device=x.device, dtype=x.dtype).view_as(xs)
            (jv,) = torch.autograd.grad(vjp_u, u, tangent, retain_graph=True)
            (jtjv,) = torch.autograd.grad(y, xs, jv, retain_graph=True)
            return jtjv.detach().reshape(-1).to(torch.float64).cpu().numpy()

        result = lanczos(matvec, xs.numel(), k=1, iterations=iterations, tol=tol, seed=seed)
    theta = float(result.eigenvalues[0])
    return SequenceNorm(math.sqrt(max(theta, 0.0)), float(result.residuals[0]), result.steps)


class BlockJacobians:
    """A float64 eval-mode copy of ``net`` and each measured block's inputs at ``images`` (``[n, C, H, W]``).

    ``blocks`` are indices into ``net.blocks``; the copy's forward (attention unfused, so double backward runs on
    every backend) records each block's positional and keyword arguments by a forward pre-hook, and the Jacobians
    are then taken of the copy's block alone, one image at a time.
    """

    def __init__(
        self, net: nn.Module, images: torch.Tensor, blocks: Sequence[int], *, device: torch.device | str | None = None
    ) -> None:
        with torch.inference_mode(False), torch.no_grad():
            self.model = copy.deepcopy(net).to(device=device, dtype=torch.float64).requires_grad_(False)
        for p in self.model.parameters():
            p.grad = None  # the Jacobians are taken of the inputs alone
        every: Sequence[nn.Module] = self.model.blocks  # type: ignore[assignment]
        self.blocks = [every[i] for i in blocks]
        self.inputs: dict[int, tuple[torch.Tensor, tuple[Any, ...], dict[str, Any]]] = {}

        def keep(k: int) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
            def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                self.inputs[k] = (args[0].detach(), args[1:], kwargs)  # e.g. EVA's rotary embedding beside x

            return hook

        handles = [b.register_forward_pre_hook(keep(k), with_kwargs=True) for k, b in enumerate(self.blocks)]
        try:
            with torch.inference_mode(False), torch.no_grad(), unfused_eval(self.model):
                self.model(images.to(device=device, dtype=torch.float64))
        finally:
            for h in handles:
                h.remove()
        self.tokens, self.dim = (int(s) for s in self.inputs[0][0].shape[1:]) if self.inputs else (0, 0)

    def _at(self, block: int, image: int) -> tuple[Block, torch.Tensor]:
        x, args, kwargs = self.inputs[block]
        module = self.blocks[block]
        return (lambda seq: module(seq, *args, **kwargs)), x[image : image + 1]

    def token(self, block: int, image: int, token: int, chunk: int) -> np.ndarray:
        """``J_tt`` of measured block ``block`` at ``image``, float64 ``[D, D]`` (`token_jacobian`)."""
        fn, x = self._at(block, image)
        with unfused_eval(self.model):
            return token_jacobian(fn, x, token, chunk=chunk).cpu().numpy()

    def sequence(self, block: int, image: int, *, iterations: int, tol: float, seed: int) -> SequenceNorm:
        """`sequence_norm` of measured block ``block`` at ``image``."""
        fn, x = self._at(block, image)
        with unfused_eval(self.model):
            return sequence_norm(fn, x, iterations=iterations, tol=tol, seed=seed)
