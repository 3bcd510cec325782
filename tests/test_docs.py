"""The docs name what the code has: every module in `docs/architecture.md`, every catalogue entry in
`docs/observables.md`, every measurement family's section there.

Modules are named by their path from the repository root, in backticks (`` `tgo/records.py` ``,
`` `callbacks/dashboard.py` ``; a package by its ``__init__.py`` or its directory, `` `tgo/observatory/` ``). A
catalogue name counts as documented where `docs/observables.md` has it in backticks, or spells it as one of the
doc's two shorthands: `` `components_90/95/99` `` (one stem, several endings) and `` `<obs>_noise` `` (the
suffix of every observable that has one, each of them documented itself).
"""

from __future__ import annotations

import re
from pathlib import Path

from tgo.spectral import CATALOGUE

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
OBSERVABLES = REPO / "docs" / "observables.md"
PACKAGES = ("tgo", "callbacks")
"""The source trees whose every module the architecture's map names (``callbacks/`` installs as ``tgo.callbacks``)."""


def modules() -> list[str]:
    """Every Python module of the package trees, as a path from the repository root."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found.append(path.relative_to(REPO).as_posix())
    return found


def backticked(text: str) -> set[str]:
    return set(re.findall(r"`([^`\n]+)`", text))


def family_modules() -> set[str]:
    """A measurement family's own module and its numerics (``tgo/spectral/<name>.py`` or ``tgo/optimisation/<name>.py``
    where they exist): documented by the family's section of `docs/observables.md`, so a family is its three files and
    that section (`test_every_family_links_a_section_of_observables_md`), not a row of the architecture's map too."""
    from tgo.observatory.families import registered_families

    found = set()
    for family in registered_families():
        for where in ("tgo/observatory/families", "tgo/spectral", "tgo/optimisation"):
            if (REPO / where / f"{family.name}.py").is_file():
                found.add(f"{where}/{family.name}.py")
    return found


def test_every_module_is_named_in_the_architecture():
    named = backticked(ARCHITECTURE.read_text(encoding="utf-8"))
    missing = []
    families = family_modules()
    for module in modules():
        path = Path(module)
        as_package = f"{path.parent.as_posix()}/" if path.name == "__init__.py" else None
        if module not in named and as_package not in named and module not in families:
            missing.append(module)
    assert not missing, f"docs/architecture.md names no {missing} (add each to its module map)"


def documented_names(text: str) -> set[str]:
    """The names `docs/observables.md` documents, its shorthands expanded."""
    tokens = backticked(text)
    names = {token for token in tokens if re.fullmatch(r"[a-z][a-z0-9_]*", token)}
    for token in tokens:  # components_90/95/99 -> components_90, components_95, components_99
        if match := re.fullmatch(r"([a-z][a-z0-9_]*_)([a-z0-9]+(?:/[a-z0-9]+)+)", token):
            names.update(match.group(1) + ending for ending in match.group(2).split("/"))
    suffixes = {match.group(1) for token in tokens if (match := re.fullmatch(r"<obs>(_[a-z0-9_]+)", token))}
    names.update(name + suffix for name in list(names) for suffix in suffixes)
    return names


def test_every_catalogue_name_is_documented_in_observables_md():
    documented = documented_names(OBSERVABLES.read_text(encoding="utf-8"))
    missing = [name for name in CATALOGUE.names if name not in documented]
    assert not missing, f"docs/observables.md documents no {missing}"


def test_the_shorthands_expand_to_names_and_nothing_else():
    text = "`components_90/95/99`, `effective_rank`, `<obs>_noise`, `python -m tgo.train`"
    assert documented_names(text) == {
        "components_90",
        "components_95",
        "components_99",
        "effective_rank",
        "effective_rank_noise",
        "components_90_noise",
        "components_95_noise",
        "components_99_noise",
    }


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_family_links_a_section_of_observables_md():
    """Each family's catalogue entries link (``doc``) a doc of the project and, where they name one, a heading of it
    that exists (the probes' metrics are documented with the hypotheses they test)."""
    from tgo.observatory.families import registered_families

    def anchors(doc: str) -> set[str]:
        lines = (REPO / doc).read_text(encoding="utf-8").splitlines()
        return {slug(line.lstrip("#")) for line in lines if line[:1] == "#"}

    broken = set()
    for family in registered_families():
        for entry in family.observables:
            doc, _, anchor = entry.doc.partition("#")
            if doc not in ("docs/observables.md", "docs/hypotheses.md") or (anchor and anchor not in anchors(doc)):
                broken.add(f"{family.name}: {entry.doc}")
    assert not broken, f"catalogue links to no heading of the docs: {sorted(broken)}"
