"""A pure-Python stand-in for a multi-rank sum all-reduce, for testing collective code without torch.distributed.

Each simulated rank runs in its own thread and calls ``all_reduce_sum`` exactly as it would call
``trainer.strategy.reduce(t, reduce_op="sum")``. Calls rendezvous on a barrier, so the simulation enforces the real
collective rule: every rank must make the same calls, with tensors of the same shape, in the same order. A rank that
makes a differently shaped call breaks the barrier at once; a rank that makes fewer calls leaves the others waiting
until ``timeout`` and the run fails (instead of hanging forever). Those are exactly the bugs this harness catches.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["SimulatedWorld"]

T = TypeVar("T")
AllReduceSum = Callable[[torch.Tensor], torch.Tensor]


class SimulatedWorld:
    """``world_size`` ranks as threads sharing one summing collective.

    Args:
        world_size: Number of simulated ranks (>= 1).
        timeout: Seconds a rank waits at a rendezvous before the run is declared broken.
        in_place: Also write the sum into the argument, like ``torch.distributed.all_reduce`` and Lightning's
            ``strategy.reduce``. With ``False`` the argument is left untouched, which catches callers that ignore the
            return value.

    Attributes:
        calls: Per-rank number of collective calls made during the last :meth:`run`.
        payload_numel: Per-call number of elements summed (from rank 0's view) during the last :meth:`run`.

    Example:
        >>> world = SimulatedWorld(3)
        >>> world.run(lambda rank, all_reduce_sum: all_reduce_sum(torch.tensor([rank])).item())
        [3, 3, 3]
    """

    def __init__(self, world_size: int, timeout: float = 30.0, in_place: bool = True):
        if world_size < 1:
            raise ValueError(f"SimulatedWorld: world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout = timeout
        self.in_place = in_place
        self.calls: list[int] = [0] * world_size
        self.payload_numel: list[int] = []
        self._slots: list[torch.Tensor | None] = [None] * world_size
        self._result: torch.Tensor | None = None
        self._barrier = threading.Barrier(world_size, action=self._reduce, timeout=timeout)  # deposit -> sum
        self._read = threading.Barrier(world_size, timeout=timeout)  # everyone has read the sum

    def _reduce(self) -> None:
        """Barrier action: runs once per collective, after every rank has deposited its tensor."""
        tensors = [t for t in self._slots if t is not None]
        shapes = {tuple(t.shape) for t in tensors}
        if len(tensors) != self.world_size or len(shapes) != 1:
            raise RuntimeError(f"SimulatedWorld: ranks disagree on the collective (shapes {sorted(shapes)})")
        total = tensors[0].clone()
        for t in tensors[1:]:
            total = total + t.to(total.device)
        self._result = total
        self.payload_numel.append(total.numel())
        self._slots = [None] * self.world_size

    def _all_reduce_sum_for(self, rank: int) -> AllReduceSum:
        def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
            self.calls[rank] += 1
            self._slots[rank] = t.detach().clone()
            self._barrier.wait()  # the action sums the slots
            assert self._result is not None
            out = self._result.clone().to(t.device)
            self._read.wait()  # nobody starts the next collective before everyone read this one
            if self.in_place:
                t.copy_(out)
            return out

        return all_reduce_sum

    def run(self, fn: Callable[[int, AllReduceSum], T]) -> list[T]:
        """Run ``fn(rank, all_reduce_sum)`` on every rank concurrently and return the per-rank results.

        Args:
            fn: The per-rank program. It receives its rank and that rank's collective.

        Returns:
            ``[fn(0, ...), fn(1, ...), ...]``.

        Raises:
            RuntimeError: If any rank raised (the first error is chained) or the ranks' collectives did not match.
        """
        self.calls = [0] * self.world_size
        self.payload_numel = []
        self._barrier.reset()
        self._read.reset()
        results: list[T | None] = [None] * self.world_size
        errors: list[BaseException | None] = [None] * self.world_size

        def target(rank: int) -> None:
            try:
                results[rank] = fn(rank, self._all_reduce_sum_for(rank))
            except BaseException as exc:
                errors[rank] = exc
                self._barrier.abort()
                self._read.abort()

        threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(self.world_size)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(self.timeout * 4)
        if any(th.is_alive() for th in threads):
            self._barrier.abort()
            self._read.abort()
            raise RuntimeError("SimulatedWorld: ranks hung (mismatched collective calls?)")
        first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)), None)
        first = first or next((e for e in errors if e is not None), None)
        if first is not None:
            raise RuntimeError(f"SimulatedWorld: a rank failed: {first!r}") from first
        if len(set(self.calls)) != 1:
            raise RuntimeError(f"SimulatedWorld: ranks made different numbers of collective calls: {self.calls}")
        return results  # type: ignore[return-value]
