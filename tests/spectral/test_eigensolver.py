"""Where the summary's eigenvalues are computed (`tgo.spectral.eigensolver`, ``observation.summary.eigensolver``).

The CPU path is numpy's ``eigvalsh`` bit for bit (the records do not move); ``gpu`` without CUDA is one clear error;
``auto`` off CUDA is the CPU; the per-shape chooser, driven here by fake backends and a fake clock, picks the
faster, times each shape once and gives every thread the same decision; ``eigendecompose_many`` solves its stacks
with the callable it is given. On a CUDA machine the GPU solver equals LAPACK to 1e-9 of the largest eigenvalue.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tgo.errors import ConfigError, UserInputError
from tgo.spectral import eigendecompose
from tgo.spectral.decomposition import eigendecompose_many
from tgo.spectral.eigensolver import (
    AGREEMENT,
    FastestEigvalsh,
    GpuEigvalsh,
    cpu_eigvalsh,
    resolve_eigvalsh,
)

CUDA = torch.cuda.is_available()


def _stack(rng: np.random.Generator, count: int, dim: int, rows: int | None = None) -> np.ndarray:
    """``count`` symmetrised sample covariances of ``rows`` rows (default ``2 dim``), ViT-like scales."""
    weights = np.exp(rng.uniform(-3, 3, dim))
    weights[: max(1, dim // 20)] *= 1e3
    covs = []
    for _ in range(count):
        x = rng.standard_normal((rows or 2 * dim, dim)) * weights
        cov = np.cov(x, rowvar=False)
        covs.append((cov + cov.T) / 2)
    return np.stack(covs)


def _bits(a: np.ndarray) -> bytes:
    return np.asarray(a, dtype=np.float64).tobytes()


# ---------------------------------------------------------------------------------------------------- CPU and settings
def test_the_cpu_solver_is_numpy_eigvalsh_bit_for_bit() -> None:
    stack = _stack(np.random.default_rng(0), 5, 24)
    assert _bits(cpu_eigvalsh(stack)) == _bits(np.linalg.eigvalsh(stack))
    assert cpu_eigvalsh(stack).dtype == np.float64 and cpu_eigvalsh(stack).shape == (5, 24)


def test_cpu_and_auto_off_cuda_resolve_to_the_cpu_solver() -> None:
    assert resolve_eigvalsh("cpu", "cpu") is cpu_eigvalsh
    assert resolve_eigvalsh("auto", "cpu") is cpu_eigvalsh
    assert resolve_eigvalsh("auto", None) is cpu_eigvalsh
    assert resolve_eigvalsh("auto", torch.device("cpu")) is cpu_eigvalsh


def test_auto_on_a_cuda_device_without_cuda_is_the_cpu_solver(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_eigvalsh("auto", "cuda") is cpu_eigvalsh


def test_gpu_without_cuda_is_one_clear_error_naming_the_setting(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cpu", "cuda", None):
        with pytest.raises(ConfigError) as caught:
            resolve_eigvalsh("gpu", device)
        message = str(caught.value)
        assert isinstance(caught.value, UserInputError)
        assert message.startswith("observation.summary.eigensolver=gpu but no CUDA device is available")
        assert message.endswith("expected cpu or auto")
        assert "\n" not in message


def test_an_unknown_setting_names_the_key_and_the_choices() -> None:
    with pytest.raises(
        ConfigError, match=r"observation\.summary\.eigensolver: expected one of \['auto', 'cpu', 'gpu'\]"
    ):
        resolve_eigvalsh("tpu", "cpu")


# ---------------------------------------------------------------------------------------------------- the chooser
class FakeClock:
    """A clock per thread that only the fake backends advance: timings are exact whatever the threads do."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self) -> float:
        return getattr(self._local, "now", 0.0)

    def advance(self, seconds: float) -> None:
        self._local.now = self() + seconds


class FakeBackend:
    """numpy's eigvalsh that "takes" ``seconds[D]`` on the fake clock and counts its calls per shape."""

    def __init__(self, clock: FakeClock, seconds: dict[int, float], offset: float = 0.0) -> None:
        self.clock, self.seconds, self.offset = clock, seconds, offset
        self.calls: Counter[tuple[int, int]] = Counter()
        self._lock = threading.Lock()

    def __call__(self, stack: np.ndarray) -> np.ndarray:
        with self._lock:
            self.calls[stack.shape[:2]] += 1
        self.clock.advance(self.seconds[stack.shape[1]])
        return np.linalg.eigvalsh(stack) * (1.0 + self.offset)


def _chooser(
    cpu_s: dict[int, float], gpu_s: dict[int, float], **kwargs
) -> tuple[FastestEigvalsh, FakeBackend, FakeBackend]:
    clock = FakeClock()
    cpu, gpu = FakeBackend(clock, cpu_s), FakeBackend(clock, gpu_s, kwargs.pop("gpu_offset", 0.0))
    return FastestEigvalsh({"cpu": cpu, "gpu": gpu}, timer=clock, **kwargs), cpu, gpu


def test_the_chooser_picks_the_faster_per_shape_and_times_each_shape_once() -> None:
    chooser, cpu, gpu = _chooser({8: 1.0, 16: 2.0}, {8: 3.0, 16: 0.5})
    rng = np.random.default_rng(1)
    small, large = _stack(rng, 3, 8), _stack(rng, 3, 16)
    for _ in range(4):
        assert _bits(chooser(small)) == _bits(np.linalg.eigvalsh(small))
        assert _bits(chooser(large)) == _bits(np.linalg.eigvalsh(large))
    choices = chooser.choices()
    assert [(shape, c.backend) for shape, c in choices.items()] == [((3, 8), "cpu"), ((3, 16), "gpu")]
    assert dict(choices[(3, 16)].seconds) == {"cpu": 2.0, "gpu": 0.5}
    assert choices[(3, 16)].difference == {"cpu": 0.0, "gpu": 0.0}
    # Each backend: a warm-up and a timed call on the first stack of a shape; then only the winner, once a stack.
    assert cpu.calls == {(3, 8): 2 + 3, (3, 16): 2}
    assert gpu.calls == {(3, 8): 2, (3, 16): 2 + 3}
    # A new S is a new shape: timed again.
    chooser(_stack(rng, 5, 16))
    assert chooser.choices()[(5, 16)].backend == "gpu" and gpu.calls[(5, 16)] == 2
    assert choices[(3, 16)].describe() == "gpu (cpu 2.0000 s; gpu 0.5000 s)"


def test_the_chooser_weighs_the_cpu_by_the_stacks_it_solves_at_once() -> None:
    """4 s on one core with 8 cores working is 0.5 s a stack: a 1 s GPU solve (queued on one device) loses."""
    chooser, _, _ = _chooser({16: 4.0}, {16: 1.0}, parallel={"cpu": 8})
    chooser(_stack(np.random.default_rng(2), 2, 16))
    choice = chooser.choices()[(2, 16)]
    assert choice.backend == "cpu"
    assert choice.cost == {"cpu": 0.5, "gpu": 1.0}
    assert "cpu 4.0000 s / 8 at once = 0.5000 s" in choice.describe()


def test_the_chooser_never_picks_a_backend_that_disagrees_with_the_reference() -> None:
    chooser, _, _ = _chooser({16: 2.0}, {16: 0.1}, gpu_offset=10 * AGREEMENT)
    stack = _stack(np.random.default_rng(3), 2, 16)
    assert _bits(chooser(stack)) == _bits(np.linalg.eigvalsh(stack))
    choice = chooser.choices()[(2, 16)]
    assert choice.backend == "cpu"
    assert choice.difference["gpu"] == pytest.approx(10 * AGREEMENT, rel=1e-3)
    assert "refused" in choice.describe()


def test_a_candidate_that_fails_is_not_chosen_and_the_reason_is_kept() -> None:
    clock = FakeClock()
    cpu = FakeBackend(clock, {16: 1.0})

    def out_of_memory(stack: np.ndarray) -> np.ndarray:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB\nmore detail")

    chooser = FastestEigvalsh({"cpu": cpu, "gpu": out_of_memory}, timer=clock)
    stack = _stack(np.random.default_rng(4), 2, 16)
    assert _bits(chooser(stack)) == _bits(np.linalg.eigvalsh(stack))
    choice = chooser.choices()[(2, 16)]
    assert choice.backend == "cpu"
    assert choice.errors == {"gpu": "OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB"}
    assert "gpu failed" in choice.describe()


def test_many_threads_get_one_decision_per_shape_and_the_numbers_of_numpy() -> None:
    chooser, cpu, gpu = _chooser({8: 1.0, 12: 1.0}, {8: 0.25, 12: 4.0})
    rng = np.random.default_rng(5)
    stacks = [_stack(rng, 4, 8), _stack(rng, 4, 12)]
    expected = [_bits(np.linalg.eigvalsh(s)) for s in stacks]
    jobs = [i % 2 for i in range(64)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        got = list(pool.map(lambda i: _bits(chooser(stacks[i])), jobs))
    assert got == [expected[i] for i in jobs]
    assert {shape: c.backend for shape, c in chooser.choices().items()} == {(4, 8): "gpu", (4, 12): "cpu"}
    # Timed once per shape (2 calls of each backend), then 31 more stacks of each shape went to its winner.
    assert gpu.calls == {(4, 8): 2 + 31, (4, 12): 2}
    assert cpu.calls == {(4, 8): 2, (4, 12): 2 + 31}


def test_the_chooser_rejects_what_is_not_a_stack() -> None:
    chooser, _, _ = _chooser({4: 1.0}, {4: 1.0})
    with pytest.raises(ValueError, match=r"expected a \[S, D, D\] stack"):
        chooser(np.eye(4))


# ------------------------------------------------------------------------------------------- eigendecompose_many
def test_eigendecompose_many_solves_its_stacks_with_the_given_eigensolver() -> None:
    rng = np.random.default_rng(6)
    covs = [*_stack(rng, 3, 16, rows=10), *_stack(rng, 2, 8)]  # rank-deficient 16s and full-rank 8s
    rows, dropped = [10, 10, 10, 16, 16], [0, 1, 0, 2, 0]
    seen: list[tuple[int, ...]] = []

    def recording(stack: np.ndarray) -> np.ndarray:
        seen.append(stack.shape)
        return np.linalg.eigvalsh(stack)

    default = eigendecompose_many(covs, rows, dropped)
    given = eigendecompose_many(covs, rows, dropped, eigvalsh=recording)
    assert seen == [(3, 16, 16), (2, 8, 8)]  # one call per dimension, every matrix of it stacked
    for a, b in zip(default, given, strict=True):
        assert _bits(a.eigenvalues) == _bits(b.eigenvalues)
        assert (a.n_rows, a.n_nonfinite, a.n_clamped) == (b.n_rows, b.n_nonfinite, b.n_clamped)
        assert _bits(a.most_negative) == _bits(b.most_negative)
    one = eigendecompose(covs[0], 10, eigvalsh=recording)
    assert seen[-1] == (1, 16, 16) and _bits(one.eigenvalues) == _bits(default[0].eigenvalues)


def test_eigendecompose_many_hands_only_defined_matrices_to_the_eigensolver() -> None:
    rng = np.random.default_rng(7)
    good, nan = _stack(rng, 1, 8)[0], np.full((8, 8), np.nan)
    seen: list[tuple[int, ...]] = []

    def recording(stack: np.ndarray) -> np.ndarray:
        seen.append(stack.shape)
        return cpu_eigvalsh(stack)

    spectra = eigendecompose_many([good, nan, good], [16, 16, 1], eigvalsh=recording)
    assert seen == [(1, 8, 8)]
    assert spectra[0].is_defined and not spectra[1].is_defined and not spectra[2].is_defined


def test_eigendecompose_many_refuses_an_eigensolver_of_the_wrong_shape() -> None:
    covs = _stack(np.random.default_rng(8), 2, 8)
    with pytest.raises(ValueError, match=r"eigvalsh gave shape \(2, 7\) for a stack \(2, 8, 8\)"):
        eigendecompose_many(covs, [16, 16], eigvalsh=lambda s: np.linalg.eigvalsh(s)[:, 1:])


# ---------------------------------------------------------------------------------------------------- on a GPU
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dim, rows", [(8, 16), (96, 200), (384, 1000), (384, 32)])
def test_the_gpu_solver_equals_lapack_to_1e_9_of_the_largest_eigenvalue(dim: int, rows: int) -> None:
    stack = _stack(np.random.default_rng(dim + rows), 11, dim, rows=rows)
    gpu = resolve_eigvalsh("gpu", "cuda")
    assert isinstance(gpu, GpuEigvalsh) and gpu.device.type == "cuda"
    values, reference = gpu(stack), cpu_eigvalsh(stack)
    assert values.dtype == np.float64 and values.shape == reference.shape
    scale = np.abs(reference).max(axis=1, keepdims=True)
    assert float(np.max(np.abs(values - reference) / scale)) <= 1e-9


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_auto_on_cuda_is_one_chooser_per_process_and_matches_lapack() -> None:
    auto = resolve_eigvalsh("auto", "cuda", cpu_workers=4)
    assert isinstance(auto, FastestEigvalsh)
    assert resolve_eigvalsh("auto", torch.device("cuda", torch.cuda.current_device()), cpu_workers=4) is auto
    stack = _stack(np.random.default_rng(9), 11, 64)
    values, reference = auto(stack), cpu_eigvalsh(stack)
    assert float(np.max(np.abs(values - reference) / np.abs(reference).max(axis=1, keepdims=True))) <= 1e-9
    choice = auto.choices()[(11, 64)]
    assert choice.backend in ("cpu", "gpu") and set(choice.seconds) == {"cpu", "gpu"}
    assert choice.parallel["cpu"] == 4
