"""The core of an observation names no measurement family (issue 35 item 1): a family owns its whole declaration in
its own module, so adding one edits no central file.

Every registered family's name and settings key is looked for in the core modules' code: as an identifier or part of
one (``settings.noise_scale``, ``NOISE_COLLECTOR``), as a string literal (``"attention"``) or in an import
(``families.weights``). Prose in comments and docstrings may still mention a family as an example.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import pytest

from tgo.observatory.families import registered_families

ROOT = Path(__file__).resolve().parents[2]
CORE = (
    "callbacks/dashboard.py",
    "callbacks/spectral_geometry.py",
    "tgo/observatory/pipeline.py",
    "tgo/observatory/stream.py",
    "tgo/observatory/standalone.py",
    "tgo/observatory/settings.py",
    "tgo/observatory/views.py",
    "tgo/panels.py",
    "tgo/observatory/results.py",
    "tgo/observatory/share.py",
    "tgo/spectral/catalogue.py",
    "tgo/report/context.py",
    "tgo/report/sections.py",
)
NAMES = sorted({n for f in registered_families() for n in (f.name, f.settings_key)})


def _code_words(path: Path) -> list[tuple[int, str]]:
    """``(line, word)`` of every identifier part and non-docstring string literal of a module."""
    words: list[tuple[int, str]] = []
    previous = tokenize.NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if token.type == tokenize.NAME:
            words.append((token.start[0], token.string.lower()))
        elif token.type == tokenize.STRING and previous not in (tokenize.NEWLINE, tokenize.INDENT, tokenize.NL):
            words.append((token.start[0], token.string.strip("rbfRBF").strip("'\"")))  # a docstring stands alone
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token.type
    return words


def _names_family(word: str, name: str) -> bool:
    parts = word.split("_")
    wanted = name.split("_")
    return word == name or any(parts[i : i + len(wanted)] == wanted for i in range(len(parts))) or f".{name}" in word


@pytest.mark.parametrize("module", CORE)
def test_the_core_names_no_registered_family(module: str) -> None:
    assert {"image_vectors", "attention", "weights", "noise_scale", "curvature", "phases"} <= set(NAMES)
    found = [
        f"{module}:{line}: {word!r} names {name!r}"
        for line, word in _code_words(ROOT / module)
        for name in NAMES
        if _names_family(word, name)
    ]
    assert not found, "\n".join(found)
