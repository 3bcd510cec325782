"""Run the test suite with the kernels another kind of x86 CPU would run: ``make test-other-cpu [CPU_KIND=...]``.

A clean clone must pass ``make test`` on any 2-core x86 machine, and what decides the last bits of a number there is
which SIMD kernels the libraries pick for the CPU: numpy's own loops (``exp``, ``log``, ``power`` differ in the last
bit between its AVX-512 and AVX2 builds), the OpenBLAS numpy and scipy ship (its kernels per core type), and torch's
ATen kernels. Each library lets a process choose lower kernels by environment variable, so one machine can run the
suite as a machine without AVX-512 (``avx2``) or without AVX at all (``x86-64``) would: a test that compares a
stored copy bit for bit fails here as it would there (the report-numbers pin did, 2026-12-06). Not part of
``make test`` (the whole suite again, slower kernels); run it before trusting a test that reads stored numbers.

``python -m tools.other_cpu KIND [PYTEST ARGS]`` runs ``pytest -q -n 2 --dist worksteal`` with the kind's variables
added to the environment; ``--print-env KIND`` prints them (``eval``-able) instead. `tests/tools/test_other_cpu.py`
checks that each kind's variables still take effect in this environment's torch, numpy and OpenBLAS.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence

_NUMPY_AVX512 = (
    "X86_V4 AVX512F AVX512CD AVX512VL AVX512BW AVX512DQ AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"
)

KINDS: dict[str, dict[str, str]] = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "OPENBLAS_CORETYPE": "Haswell",
        "NPY_DISABLE_CPU_FEATURES": _NUMPY_AVX512,
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    },
    "x86-64": {
        "ATEN_CPU_CAPABILITY": "default",
        "OPENBLAS_CORETYPE": "Prescott",
        "NPY_DISABLE_CPU_FEATURES": f"X86_V3 {_NUMPY_AVX512}",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}
"""Per kind, the variables that make torch (``ATEN_CPU_CAPABILITY``), OpenBLAS (``OPENBLAS_CORETYPE``), numpy
(``NPY_DISABLE_CPU_FEATURES``; its ``X86_V3`` group is AVX2 and FMA3, ``X86_V4`` AVX-512), MKL and oneDNN use that
CPU's kernels. ``avx2``: a Haswell-to-Zen 3 class CPU; ``x86-64``: one with SSE4.2 and no AVX."""

TORCH_CAPABILITY = {"avx2": "AVX2", "x86-64": "DEFAULT"}
"""What ``torch.backends.cpu.get_cpu_capability()`` reports under each kind."""

CAPABILITY_ORDER = ("DEFAULT", "AVX2", "AVX512")
"""torch's x86 kernel levels, lowest first: a CPU runs a kind whose level is at or below its own."""


def unreachable(kind: str, native_capability: str) -> str | None:
    """Why this CPU (torch's ``native_capability``) cannot run ``kind``'s kernels, or None when it can.

    A kind above the CPU's own level would load kernels with instructions it lacks (OpenBLAS's Haswell set dies with
    an illegal instruction on a CPU without AVX2), so it is refused before the suite starts.
    """
    wanted = TORCH_CAPABILITY[kind]
    if native_capability not in CAPABILITY_ORDER:
        return f"this CPU runs torch's {native_capability} kernels, not x86's {list(CAPABILITY_ORDER)}"
    level = CAPABILITY_ORDER.index(native_capability)
    if level < CAPABILITY_ORDER.index(wanted):
        lower = [k for k, c in TORCH_CAPABILITY.items() if CAPABILITY_ORDER.index(c) <= level]
        return f"this CPU has torch's {native_capability} kernels, below {kind}'s {wanted}; kinds it can run: {lower}"
    return None


def native_capability() -> str:
    """torch's kernel level on this CPU, asked of a child process without any kind's variables (the parent's may be
    set by an enclosing run, and torch reads them once at import)."""
    clean = {k: v for k, v in os.environ.items() if not any(k in variables for variables in KINDS.values())}
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    done = subprocess.run([sys.executable, "-c", probe], env=clean, capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def environment(kind: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the kind's variables set."""
    if kind not in KINDS:
        raise ValueError(f"unknown CPU kind {kind!r}; expected one of {sorted(KINDS)}")
    return {**(os.environ if base is None else base), **KINDS[kind]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.other_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(KINDS), help="the CPU kind whose kernels the suite runs")
    parser.add_argument("--print-env", action="store_true", help="print the variables instead of running pytest")
    args, pytest_args = parser.parse_known_args(argv)
    if args.print_env:
        for name, value in KINDS[args.kind].items():
            print(f"export {name}='{value}'")
        return 0
    reason = unreachable(args.kind, native_capability())
    if reason is not None:
        print(f"[tools.other_cpu] cannot run {args.kind}: {reason}", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "worksteal", *pytest_args]
    print(f"[tools.other_cpu] {args.kind}: {' '.join(f'{k}={v!r}' for k, v in KINDS[args.kind].items())}", flush=True)
    return subprocess.call(command, env=environment(args.kind))


if __name__ == "__main__":
    raise SystemExit(main())
