"""`tools.other_cpu` (``make test-other-cpu``): each CPU kind's variables still reach torch, numpy and OpenBLAS.

The target is only worth running if the libraries honour the variables; a renamed variable in a later release would
make it run this machine's kernels again and pass without testing anything. So a child process with each kind's
environment reports what the libraries chose, against the same report from an unchanged environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tools.other_cpu import KINDS, TORCH_CAPABILITY, environment, main, unreachable

_REPORT = """
import hashlib, json
import numpy as np, torch
from numpy._core._multiarray_umath import __cpu_features__
from threadpoolctl import threadpool_info
x = np.linspace(0.1, 10.0, 100_001)
a = np.random.default_rng(0).standard_normal((257, 1001))
print(json.dumps({
    "torch": torch.backends.cpu.get_cpu_capability(),
    "openblas": sorted({i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"}),
    "numpy_exp": hashlib.sha256(np.exp(x).tobytes()).hexdigest(),
    "numpy_avx512": bool(__cpu_features__.get("AVX512_SKX")),
    "blas_product": hashlib.sha256((a @ a.T).tobytes()).hexdigest(),
}))
"""


def _report(env: dict[str, str] | None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _REPORT], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def native() -> dict:
    """What this machine's own kernels give (the kinds' variables removed, should the suite run under one)."""
    return _report({k: v for k, v in os.environ.items() if not any(k in kind for kind in KINDS.values())})


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_makes_torch_numpy_and_openblas_choose_that_cpus_kernels(kind: str, native: dict):
    reason = unreachable(kind, native["torch"])
    if reason is not None:  # a CPU below the kind (no AVX2 for avx2) would die on its kernels; the tool refuses it
        pytest.skip(reason)
    other = _report(environment(kind))
    assert other["torch"] == TORCH_CAPABILITY[kind]
    # OpenBLAS names the kernel set it loaded (Prescott's is "Katmai"): another one than this machine's, unless this
    # machine is that kind, and a product with other bits
    if native["openblas"] != [KINDS[kind]["OPENBLAS_CORETYPE"]]:
        assert other["openblas"] != native["openblas"], f"OpenBLAS kept {native['openblas']} under {kind}"
        assert other["blas_product"] != native["blas_product"], "OpenBLAS gave this CPU's bits under another core type"
    if native["numpy_avx512"]:  # this machine's numpy runs AVX-512 loops: the kind must take them away
        assert other["numpy_exp"] != native["numpy_exp"], "numpy's exp gave this CPU's bits: its AVX-512 loops ran"


def test_an_unknown_kind_is_refused_with_the_kinds_there_are(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(ValueError, match=r"unknown CPU kind 'avx512'; expected one of \['avx2', 'x86-64'\]"):
        environment("avx512")
    with pytest.raises(SystemExit):
        main(["avx512"])
    assert "invalid choice: 'avx512'" in capsys.readouterr().err


def test_print_env_prints_the_kinds_variables_for_a_shell(capsys: pytest.CaptureFixture[str]):
    assert main(["avx2", "--print-env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"export {k}='{v}'" for k, v in KINDS["avx2"].items()]


@pytest.mark.parametrize(
    ("kind", "native", "refused"),
    [
        ("avx2", "AVX512", False),
        ("avx2", "AVX2", False),
        ("avx2", "DEFAULT", True),  # a Sandy Bridge: no AVX2, OpenBLAS's Haswell kernels would be illegal there
        ("x86-64", "DEFAULT", False),
        ("x86-64", "SVE256", True),  # not an x86 CPU at all
    ],
)
def test_a_kind_above_this_cpus_own_kernels_is_refused_in_one_line(kind: str, native: str, refused: bool):
    reason = unreachable(kind, native)
    assert (reason is not None) is refused
    if reason is not None:
        assert "\n" not in reason and native in reason


def test_the_tool_refuses_before_pytest_starts_on_a_cpu_below_the_kind(monkeypatch, capsys):
    import tools.other_cpu as other_cpu

    monkeypatch.setattr(other_cpu, "native_capability", lambda: "DEFAULT")
    monkeypatch.setattr(other_cpu.subprocess, "call", lambda *a, **k: pytest.fail("pytest was started"))
    assert main(["avx2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "[tools.other_cpu] cannot run avx2: this CPU has torch's DEFAULT kernels, below avx2's AVX2; "
        "kinds it can run: ['x86-64']"
    )
