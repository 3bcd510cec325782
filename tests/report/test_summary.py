"""The report's verdict summary on its first screen: the counts and one sentence on what they can conclude."""

from __future__ import annotations

import html as html_text
import math
import re
from pathlib import Path

import numpy as np

from tests.report.synthetic import write_synthetic_run
from tgo.report.build import build_report
from tgo.report.findings import FAILS, HOLDS, INCONCLUSIVE, NA, Finding, Trend
from tgo.report.summary import verdict_counts_line, verdict_scope_sentence
from tgo.report.verdicts import Uncertainty


def _finding(verdict: str, uncertainty: Uncertainty) -> Finding:
    nan = math.nan
    trend = Trend(7, 1, 1.0, 2.0, 1.0, 1.0, uncertainty, nan, 30, "30", 2.0, 0.0, Uncertainty(), verdict)
    return Finding("rank_rises", "effective rank rises", "effective_rank", "block_01", "rises", trend, verdict)


def test_the_sentence_counts_the_rows_judged_beyond_training_noise_and_names_what_a_run_cannot_see():
    with_training = Uncertainty(jackknife=0.1, paired=True, training=0.3, training_source="pooled", training_dof=21)
    image_sampling_only = Uncertainty(jackknife=0.1, paired=True)
    findings = [
        _finding(HOLDS, with_training),
        _finding(HOLDS, image_sampling_only),
        _finding(FAILS, image_sampling_only),
        _finding(INCONCLUSIVE, with_training),
        _finding(NA, Uncertainty()),  # not judged: not counted
    ]
    sentence = verdict_scope_sentence(findings, {}, 1)
    assert "for the 2 of 4 judged rows" in sentence
    assert sentence.count(".") == 1 and sentence.endswith(".")  # one sentence
    assert "image sampling" in sentence and "training noise" in sentence and "another seed" in sentence
    assert "mean of 3 runs" in verdict_scope_sentence(findings, {}, 3)
    assert verdict_counts_line(findings, {}) == (
        "Verdicts: the paper's claims 2 holds, 1 inconclusive, 1 does not hold, 1 n/a."
    )
    assert verdict_counts_line([], {}) == ""


def test_the_first_screen_shows_the_counts_and_the_sentence_above_the_header_table(tmp_path: Path):
    curves = {"effective_rank": {"block_01": lambda e: 3.0 + e, "cls": lambda e: 4.0 + e}}
    run = write_synthetic_run(
        tmp_path / "run",
        curves,
        epochs=np.arange(0, 7),
        stderr={"effective_rank": {"block_01": lambda e: 0.1 + 0 * e, "cls": lambda e: 0.1 + 0 * e}},
    )
    html = build_report([run], correlation=False).read_text(encoding="utf-8")
    header = html[html.index('id="header"') : html.index("</table>", html.index('id="header"'))]
    notes = re.findall(r'<p class="note">([^<]*)</p>', header)
    assert html_text.unescape(notes[0]).startswith("Verdicts: the paper's claims ") and "holds" in notes[0]
    assert notes[1].startswith("One run can conclude what it did on these images beyond image sampling")
    assert header.index(notes[1]) < header.index("<table")


def test_a_run_at_chance_accuracy_is_said_on_the_first_screen():
    """Issue 37: a run whose final top-1 is within 1.5 times chance did not learn, said in one sentence; a run that
    learned, or one whose accuracy or class count is unknown, gets none."""
    from types import SimpleNamespace

    from tgo.report.summary import learning_sentence

    flat = SimpleNamespace(top1=0.1003, classes=10)
    learned = SimpleNamespace(top1=0.986, classes=10)
    unknown = SimpleNamespace(top1=None, classes=10)
    line = learning_sentence(["smoke", "quickstart", "old"], [flat, learned, unknown])
    assert line.startswith("Did not learn:") and "smoke (10.0% against 10.0%)" in line and "quickstart" not in line
    assert learning_sentence(["quickstart"], [learned]) == ""
    assert learning_sentence(["old"], [unknown]) == ""
    assert learning_sentence(["edge"], [SimpleNamespace(top1=0.15, classes=10)]) != ""  # 1.5 x chance: flagged
    assert learning_sentence(["edge"], [SimpleNamespace(top1=0.16, classes=10)]) == ""
