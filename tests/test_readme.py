"""The README's code runs as written: every block marked runnable is executed in a fresh temporary directory.

The convention: an HTML comment (invisible on GitHub) on the line right before a ```python or ```bash fence marks
the block.

* ``<!-- runnable -->``: the block runs alone, in a new temporary directory: a python block as a script with this
  interpreter, a bash block with ``bash -euo pipefail``. This interpreter's ``bin/`` comes first on ``PATH``, so
  ``python``, ``tgo-train``, ``tgo-observe`` and ``tgo-report`` are those of this environment (``make`` installs
  them). A block should take seconds.
* ``<!-- runnable slow -->``: the same, for a block expected to take over 20 s; its test is marked ``slow``.
* ``<!-- runnable: wheel -->`` (a bash block): run by ``tests/test_packaging.py`` instead, with the built wheel
  installed outside the checkout, from a directory outside it: the way a reader who did ``pip install .`` runs it
  (and the suite trains the smoke experiment once for both).
* ``<!-- runnable: prelude=NAME -->`` (a python block; ``slow`` may come before the colon): a snippet that leaves
  part of the context to the reader (a validation set, a LightningModule). `PRELUDES` ``[NAME]`` runs before it and
  `EPILOGUES` ``[NAME]`` after it, in the same script; the epilogue finishes the job the snippet starts (e.g. a short
  ``fit``) and asserts that it did what the README says.

Blocks that would take minutes (``make run``, ``make test``) or need what a CPU machine lacks (ImageNet, GPUs, SLURM)
are not marked. The tests fail when no block is marked (so this test cannot rot to nothing), when a marker does not
stand right before a python or bash fence or names an unknown prelude, and when the README loses its first two
commands, the callback snippet, or a file it points to.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TIMEOUT_S = 900
MARKER = re.compile(r"^<!--\s*runnable\b(?P<options>[^>]*?)\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\s*$")

CALLBACK_SNIPPET = """\
from tgo.callbacks import SpectralGeometryCallback
from tgo.data import stratified_subset

analysis = stratified_subset(val_set, per_class=10, seed=0)  # any labelled Dataset of (image, label)
geometry = SpectralGeometryCallback(analysis=analysis, every_n_epochs=5)  # finds the timm ViT in your module
trainer = L.Trainer(max_epochs=20, callbacks=[geometry])
"""
"""The README's "Observe your own training" snippet, verbatim (issue 21 item 8)."""

PRELUDES = {
    "lightning": '''
import lightning as L
import timm
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

digits = load_digits()  # 1,797 real 8x8 digits, bundled with scikit-learn: no download
images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
images = images.repeat_interleave(2, dim=-1).repeat_interleave(2, dim=-2)  # 1 x 16 x 16
labels = torch.tensor(digits.target)
train_set = TensorDataset(images[:512], labels[:512])
val_set = TensorDataset(images[1200:1500], labels[1200:1500])


class Classifier(L.LightningModule):
    """A user's own module: the timm ViT under a name TGO does not know."""

    def __init__(self):
        super().__init__()
        self.backbone = timm.create_model(
            "vit_tiny_patch16_224", img_size=16, patch_size=4, in_chans=1, embed_dim=32, depth=2, num_heads=2,
            num_classes=10,
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.backbone(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
''',
}
"""What a snippet leaves to the reader, by the name its marker gives."""

EPILOGUES = {
    "lightning": """
from pathlib import Path

from tgo.records import load_series

trainer.fit_loop.max_epochs = 1  # the README's 20 epochs, one here: observed after epoch 0 and the last
trainer.fit(Classifier(), DataLoader(train_set, batch_size=64, shuffle=True))
records = sorted(p for p in Path.cwd().rglob("metrics.csv") if p.parent.name == "geometry")
assert records, f"the callback wrote no geometry/metrics.csv under {Path.cwd()}"
series = load_series(records[0].parent.parent)
epochs, values = series["effective_rank"]["block_02"]
assert list(epochs) == [0, 1], epochs
print("observed epochs", list(epochs), "effective rank at block_02", list(values))
""",
}
"""What finishes a snippet and checks that it did its job."""


@dataclass(frozen=True)
class Block:
    """One marked README code block.

    Attributes:
        line: The 1-based line of its opening fence.
        lang: ``python`` or ``bash``.
        code: Its text.
        slow: Marked ``slow``.
        prelude: The name of its prelude / epilogue pair, or ``None``.
    """

    line: int
    lang: str
    code: str
    slow: bool = False
    prelude: str | None = None
    wheel: bool = False

    @property
    def id(self) -> str:
        return f"README.md:{self.line}:{self.lang}" + (f":{self.prelude}" if self.prelude else "")


def _options(text: str, line: int) -> tuple[bool, str | None, bool]:
    """``slow``, ``prelude=NAME`` and ``wheel`` from a marker's text after ``runnable``."""
    slow, prelude, wheel = False, None, False
    for token in text.replace(":", " ").split():
        if token == "slow":
            slow = True
        elif token == "wheel":
            wheel = True
        elif token.startswith("prelude="):
            prelude = token.split("=", 1)[1]
        else:
            raise ValueError(f"README.md:{line}: unknown runnable option {token!r} (use slow, prelude=NAME, wheel)")
    return slow, prelude, wheel


def parse_blocks(text: str) -> list[Block]:
    """The marked blocks of a Markdown text (see the module docstring).

    Raises:
        ValueError: a marker not directly before a python or bash fence, an unknown option or prelude, an
            unclosed fence.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: tuple[int, bool, str | None, bool] | None = None
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        fence = FENCE.match(lines[i])
        if marker:
            pending = (i + 1, *_options(marker.group("options"), i + 1))
            i += 1
            continue
        if fence:
            start = i
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise ValueError(f"README.md:{start + 1}: unclosed code fence")
            if pending is not None:
                if pending[0] != start:
                    raise ValueError(f"README.md:{pending[0]}: a runnable marker must stand right before its fence")
                lang = fence.group("lang")
                if lang not in ("python", "bash"):
                    raise ValueError(f"README.md:{start + 1}: runnable blocks are python or bash, not {lang!r}")
                _, slow, prelude, wheel = pending
                if wheel and lang != "bash":
                    raise ValueError(f"README.md:{pending[0]}: a wheel block is bash")
                if prelude is not None and (lang != "python" or prelude not in PRELUDES or prelude not in EPILOGUES):
                    raise ValueError(f"README.md:{pending[0]}: no python prelude named {prelude!r}")
                blocks.append(Block(start + 1, lang, "\n".join(lines[start + 1 : end]) + "\n", slow, prelude, wheel))
                pending = None
            i = end + 1
            continue
        if pending is not None and lines[i].strip():
            raise ValueError(f"README.md:{pending[0]}: a runnable marker must stand right before its fence")
        i += 1
    if pending is not None:
        raise ValueError(f"README.md:{pending[0]}: a runnable marker with no code block after it")
    return blocks


BLOCKS = parse_blocks(README.read_text(encoding="utf-8"))


def _params() -> list:
    return [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if b.slow else []) for b in BLOCKS if not b.wheel]


def _script(block: Block) -> str:
    if block.prelude is None:
        return block.code
    return PRELUDES[block.prelude] + "\n# --- README.md block ---\n" + block.code + EPILOGUES[block.prelude]


@pytest.mark.parametrize("block", _params())
def test_a_runnable_readme_block_runs(block: Block, tmp_path: Path):
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "MPLBACKEND": "Agg"}
    env.pop("PYTHONPATH", None)  # the installed package, as a reader would have it
    script = tmp_path / ("block.py" if block.lang == "python" else "block.sh")
    script.write_text(_script(block), encoding="utf-8")
    command = [sys.executable, str(script)] if block.lang == "python" else ["bash", "-euo", "pipefail", str(script)]
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (
        f"{block.id} exited with {done.returncode}\n--- stdout ---\n{done.stdout[-4000:]}\n"
        f"--- stderr ---\n{done.stderr[-6000:]}"
    )


def test_the_readme_marks_blocks_of_both_kinds():
    assert BLOCKS, "no README block is marked <!-- runnable -->: the docs test would test nothing"
    assert [b.id for b in BLOCKS if b.wheel], "the smoke pipeline block is run with the installed wheel"
    assert {b.lang for b in BLOCKS} == {"python", "bash"}
    assert any(not b.slow for b in BLOCKS), "every runnable block is slow"


def test_the_marker_rules_are_enforced():
    good = "<!-- runnable slow: prelude=lightning -->\n```python\nx = 1\n```\n"
    (block,) = parse_blocks(good)
    assert (block.line, block.lang, block.slow, block.prelude) == (2, "python", True, "lightning")
    assert block.code == "x = 1\n"
    assert parse_blocks("```python\nx = 1\n```\n") == []  # unmarked
    for bad in (
        "<!-- runnable -->\n\n```python\nx\n```\n",  # not right before its fence
        "<!-- runnable -->\ntext\n```python\nx\n```\n",
        "<!-- runnable -->\n```text\nx\n```\n",  # neither python nor bash
        "<!-- runnable: prelude=nope -->\n```python\nx\n```\n",
        "<!-- runnable quick -->\n```bash\nx\n```\n",
        "<!-- runnable -->\n",
        "<!-- runnable -->\n```bash\nx\n",
    ):
        with pytest.raises(ValueError):
            parse_blocks(bad)


def _fenced(text: str) -> list[tuple[str, list[str]]]:
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            blocks.append((fence.group("lang"), lines[i + 1 : end]))
            i = end
        i += 1
    return blocks


def test_the_first_two_commands_are_make_run_and_make_test():
    lang, lines = _fenced(README.read_text(encoding="utf-8"))[0]
    commands = [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
    assert lang == "bash" and commands[:2] == ["make run", "make test"]
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^run: \$\(STAMP\)$", makefile, re.M) and re.search(r"^test: \$\(STAMP\)$", makefile, re.M)


def test_the_callback_snippet_is_shown_verbatim_and_run():
    text = README.read_text(encoding="utf-8")
    assert f"```python\n{CALLBACK_SNIPPET}```" in text
    assert any(b.code == CALLBACK_SNIPPET and b.prelude == "lightning" for b in BLOCKS)
    assert 'tgo.observe_model(model, dataset, out="runs/probe", epoch=0)' in text
    assert "examples/own_lightning.py" in text


def test_what_the_readme_points_to_exists():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)\)", text)  # Markdown links and the image
    paths = re.findall(r"`((?:docs|examples|tests|tgo|callbacks)/[\w./-]+\.(?:md|py|png))`", text)
    assert links and paths
    missing = sorted({p for p in links + paths if "://" not in p and not (REPO / p).exists()})
    assert not missing, f"README.md points to files that do not exist: {missing}"
    assert any(link.startswith("docs/img/") for link in links), "the README shows one figure from docs/img"


def test_the_readme_stays_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move detail to docs/ (it is the newcomer's page)"
