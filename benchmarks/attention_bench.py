"""Rows 9 of ``python -m benchmarks``: the attention family (``observation.attention``) on against off.

9.1 the streaming pass with the family's hooks and accumulators against the same pass without, float32 recomputation
(the CPU default; target <= 1.15x); 9.2 the same in float64; 9.3 rank 0's summary with and without the attention
summaries. The family is started and streamed as an observation does it (`tgo.observatory.pipeline.start_families`,
``_harness.stream_pass(..., families=[run])``); interleaved ``off, on, off, ...`` (`_harness.interleaved`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from benchmarks import _harness as h

ATTENTION_TARGET = 1.15
"""Target of row 9.1 (the issue's): the streaming pass with the attention family / without."""


def attention_pass(net: torch.nn.Module, dataset: Any, batch: int, dtype: str) -> tuple[Any, Any, dict[str, Any]]:
    """``(off, on, last)`` of `_harness.family_pass` for the attention family, ``on`` checking the family's state."""
    from tgo.observatory.families import ATTENTION

    settings = h.observation_settings().replace(attention={"enabled": True, "dtype": dtype})
    off, on, last = h.family_pass(ATTENTION, net, dataset, batch, torch.device("cpu"), settings)

    def checked() -> None:
        on()
        last["on"][1].state.check()

    return off, checked, last


def attention_rows(
    table: Any, spec: Any, net: torch.nn.Module, images: Any, batch: int, repeats: int, rows: Sequence[str]
) -> dict[str, Any]:
    """Rows 9.1-9.3 on ``spec``'s network and images (rows ``rows``: the float32 pass, float64 pass, summary)."""
    from tgo.observatory import summarize_accumulators
    from tgo.observatory.families.attention import attention_contribution

    raw: dict[str, Any] = {"images": len(images), "groups": h.default_groups(), "repeats": repeats}
    for row, dtype in zip(rows[:2], ("float32", "float64"), strict=True):
        off, on, last = attention_pass(net, images, batch, dtype)
        raw[dtype] = h.paired(off, on, repeats)
        ratio = raw[dtype]["ratio"]
        met = "met" if ratio <= ATTENTION_TARGET else "MISSED"
        default = "CPU default (auto)" if dtype == "float32" else "GPU default; dtype=float64 on a CPU"
        table.add(
            row,
            f"{spec.label}: stream attention on / off, {dtype} recomputation",
            ratio,
            "x",
            f"{default}; {spec.depth} blocks, G={raw['groups']}, {len(images)} images; stream "
            f"{raw[dtype]['on_s']:.2f} s vs {raw[dtype]['off_s']:.2f} s, median of {repeats} interleaved pairs; "
            f"target <= {ATTENTION_TARGET:.2f}x {met}",
            ratios=raw[dtype]["ratios"],
        )
    accs, run = last["on"]  # one process: the local sums are the reduced ones
    state = run.state
    fit_range = h.observation_settings().fit_range

    def covariance() -> None:
        summarize_accumulators(accs, nan_if_nonfinite=True, fit_range=fit_range)

    def attention() -> None:
        for acc in state.accumulators.values():
            attention_contribution(acc.summary())

    timed = h.alternated({"covariance": covariance, "attention": attention}, repeats)
    cov, att = timed["warm_s"]["covariance"], timed["warm_s"]["attention"]
    runs = timed["warm_runs"]
    raw["summary_s"] = {**timed["warm_s"], "covariance_runs": runs["covariance"], "attention_runs": runs["attention"]}
    table.add(
        rows[2],
        f"rank-0 summary, {spec.points} points + {spec.depth} attention blocks / covariances alone",
        (cov + att) / max(cov, 1e-12),
        "x",
        f"covariance summary {cov:.3f} s + attention {att:.4f} s ({spec.depth} blocks, G={raw['groups']} "
        f"leave-one-out replicates each), noise cache warm, median of {max(repeats, 1)}",
        text=f"{cov + att:.3f} / {cov:.3f} s",
    )
    return raw
