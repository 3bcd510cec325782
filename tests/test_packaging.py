"""The package works when installed (issue 21 item 3): one import name, configs as package data, console scripts.

The fast tests read pyproject.toml (every package under tgo/, plus callbacks/ and conf/ mapped to tgo.callbacks and
tgo.conf, is listed, and every config and resource is package data) and the built wheel (it installs ``tgo`` and
nothing else). The slow one builds the wheel, installs it with ``pip install --target`` and runs the README's smoke
pipeline (its block marked ``runnable: wheel``: ``tgo-train``, ``tgo-report``), then ``tgo-observe``, from a
directory outside the checkout that holds a ``callbacks/`` and a ``conf/`` of its own, with the checkout
unimportable, after proving in that environment that every module and config comes from the installed copy.

The wheel is built from a copy of the files a build reads (pyproject.toml, README, the package directories), not in
the checkout: setuptools builds in-tree, so a build there would write build/ and tgo.egg-info/ into a work tree
other processes use, race a concurrent build, and let a stale build/lib/ put modules into the wheel that the
checkout no longer has.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.test_readme import BLOCKS as README_BLOCKS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
SCRIPTS = {"tgo-train": "tgo.train:main", "tgo-observe": "tgo.observe:main", "tgo-report": "tgo.report.__main__:main"}
LICENSE_GLOBS = ("LICEN[CS]E*", "COPYING*", "NOTICE*", "AUTHORS*")  # setuptools' default license-files
SKIP = {"__pycache__"}


def package_dir(package: str) -> Path:
    """The checkout directory setuptools builds ``package`` from (``tool.setuptools.package-dir``, else its path)."""
    mapping = SETUPTOOLS.get("package-dir", {})
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in mapping:
            return REPO / mapping[".".join(parts[:i])] / Path(*parts[i:])
    return REPO / Path(*parts)


def walk_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not SKIP & set(p.relative_to(root).parts))


def python_packages(root: Path, name: str) -> set[str]:
    """Every directory under ``root`` with an ``__init__.py``, as a dotted name under ``name``."""
    found = set()
    for init in walk_files(root):
        if init.name == "__init__.py":
            rel = init.parent.relative_to(root).parts
            found.add(".".join((name, *rel)))
    return found


def package_data_files() -> set[Path]:
    """The checkout files ``tool.setuptools.package-data`` ships (globbed like setuptools, from each package)."""
    covered: set[Path] = set()
    for package, patterns in SETUPTOOLS.get("package-data", {}).items():
        for pattern in patterns:
            covered |= {p for p in package_dir(package).glob(pattern) if p.is_file()}
    return covered


def test_pyproject_lists_every_package_and_ships_every_config_and_resource():
    packages = set(SETUPTOOLS["packages"])
    assert SETUPTOOLS.get("package-dir") == {"tgo.callbacks": "callbacks", "tgo.conf": "conf"}
    expected = python_packages(REPO / "tgo", "tgo") | python_packages(REPO / "callbacks", "tgo.callbacks")
    expected |= python_packages(REPO / "conf", "tgo.conf")
    assert {"tgo.callbacks", "tgo.conf"} <= expected
    assert packages == expected, (
        f"pyproject.toml [tool.setuptools] packages: missing {sorted(expected - packages)}, "
        f"not a package {sorted(packages - expected)}"
    )
    # A folder of modules without __init__.py would be a namespace package that the explicit list leaves out.
    for root in ("tgo", "callbacks"):
        for module in walk_files(REPO / root):
            if module.suffix == ".py":
                assert (module.parent / "__init__.py").is_file(), f"{module.parent} has modules but no __init__.py"
    shipped = package_data_files()
    configs = [p for p in walk_files(REPO / "conf") if p.suffix in (".yaml", ".yml")]
    assert len(configs) > 10 and (REPO / "conf" / "experiment" / "smoke.yaml") in configs
    missing = [str(p.relative_to(REPO)) for p in configs if p not in shipped]
    assert not missing, f"configs the wheel would leave out (tool.setuptools.package-data): {missing}"
    resources = [p for p in walk_files(REPO / "tgo") if p.suffix not in (".py", ".pyc")]
    assert resources, "tgo/resources holds the class list and the published measurements"
    missing = [str(p.relative_to(REPO)) for p in resources if p not in shipped]
    assert not missing, f"data files under tgo/ the wheel would leave out (tool.setuptools.package-data): {missing}"


def copy_build_inputs(dest: Path) -> Path:
    """The files a build of the checkout reads, copied to ``dest`` (see the module docstring for why)."""
    roots = {"tgo", *(Path(d).parts[0] for d in SETUPTOOLS.get("package-dir", {}).values())}
    for root in sorted(roots):
        shutil.copytree(REPO / root, dest / root, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    readme = PYPROJECT["project"].get("readme")
    files = {"pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in", *([readme] if isinstance(readme, str) else [])}
    for pattern in LICENSE_GLOBS:
        files |= {p.name for p in REPO.glob(pattern)}
    for name in sorted(files):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, dest / name)
    return dest


def quiet_pip_env() -> dict[str, str]:
    return {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel --no-deps --no-build-isolation --no-index`` of the checkout (no network: setuptools and wheel come
    from the test extra)."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.fail("building the wheel needs setuptools in this environment: pip install -e '.[test]'")
    work = tmp_path_factory.mktemp("wheel")
    src = copy_build_inputs(work / "src")
    dist = work / "dist"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    built = subprocess.run(
        [*command, "-w", str(dist), str(src)], capture_output=True, text=True, timeout=300, env=quiet_pip_env()
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = dist.glob("tgo-*.whl")
    return path


def test_the_wheel_installs_tgo_alone_with_its_configs_callbacks_and_console_scripts(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        assert {n.split("/")[0] for n in names} == {"tgo", info}, "the wheel installs a top-level name besides tgo"
        if f"{info}/top_level.txt" in names:
            assert archive.read(f"{info}/top_level.txt").decode().split() == ["tgo"]
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(f"{info}/entry_points.txt").decode())
    assert dict(entry_points["console_scripts"]) == SCRIPTS
    expected = {
        f"{prefix}/{path.relative_to(REPO / root).as_posix()}"
        for root, prefix in (("tgo", "tgo"), ("callbacks", "tgo/callbacks"), ("conf", "tgo/conf"))
        for path in walk_files(REPO / root)
    }
    assert "tgo/conf/experiment/smoke.yaml" in expected and "tgo/callbacks/spectral_geometry.py" in expected
    assert not expected - names, f"in the checkout but not in the wheel: {sorted(expected - names)}"


USERS_OWN = 'raise ImportError("the user\'s own callbacks package was imported instead of tgo.callbacks")\n'

PROBE = """
import importlib.resources, json, sys
from importlib import metadata
import tgo, tgo.callbacks, tgo.conf, tgo.config, tgo.observe, tgo.report.__main__, tgo.report.runinfo, tgo.train
from tgo.callbacks.spectral_geometry import SpectralGeometryCallback
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
with initialize_config_module(config_module=tgo.config.CONFIG_MODULE, version_base="1.3"):
    cfg = compose("train", overrides=["experiment=smoke"])
    sources = [f"{s.scheme()}://{s.path}" for s in GlobalHydra.instance().config_loader().get_sources()]
print(json.dumps({
    "tgo": tgo.__file__,
    "tgo.callbacks": tgo.callbacks.__file__,
    "tgo.callbacks.spectral_geometry": sys.modules[SpectralGeometryCallback.__module__].__file__,
    "tgo.conf": tgo.conf.__file__,
    "tgo.conf train.yaml": str(importlib.resources.files("tgo.conf").joinpath("train.yaml")),
    "tgo metadata": str(metadata.distribution("tgo").locate_file("tgo")),
    "tgo.report.runinfo": tgo.report.runinfo.__file__,
    "editable finder on sys.meta_path": any("Editable" in getattr(f, "__name__", "") for f in sys.meta_path),
    "top-level callbacks imported": "callbacks" in sys.modules,
    "hydra config sources": sources,
    "composed experiment": cfg.experiment_name,
    "callback target": cfg.callbacks.spectral_geometry._target_,
}))
"""


def tgo_lines(output: str) -> list[str]:
    """TGO's own messages in a command's output (progress bars share lines with them)."""
    return [line[line.index("[tgo]") :].strip() for line in output.replace("\r", "\n").splitlines() if "[tgo]" in line]


def git(cwd: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    subprocess.run(["git", *args], cwd=cwd, env={**env, "GIT_COMMITTER_EMAIL": "t@t"}, check=True, capture_output=True)


@pytest.mark.slow
def test_the_installed_wheel_trains_observes_and_reports_from_outside_the_checkout(wheel: Path, tmp_path: Path):
    started = time.monotonic()
    # The install lives inside somebody else's git repository, untracked (like a project's .venv): the report must
    # not take that repository's commit for TGO's.
    project = tmp_path / "project"
    project.mkdir()
    if shutil.which("git"):
        (project / "notes.txt").write_text("not TGO\n", encoding="utf-8")
        git(project, "init", "-q")
        git(project, "add", "notes.txt")
        git(project, "commit", "-qm", "someone else's repository")
    site = project / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel)]
    installed = subprocess.run(pip, capture_output=True, text=True, timeout=300, env=quiet_pip_env())
    assert installed.returncode == 0, installed.stdout + installed.stderr
    scripts = {name: site / "bin" / name for name in SCRIPTS}
    assert all(os.access(path, os.X_OK) for path in scripts.values()), sorted(os.listdir(site / "bin"))

    # The user's working directory: their own callbacks/ package and conf/ tree must not be picked up.
    cwd = tmp_path / "elsewhere"
    (cwd / "callbacks").mkdir(parents=True)
    (cwd / "callbacks" / "__init__.py").write_text(USERS_OWN, encoding="utf-8")
    (cwd / "callbacks" / "spectral_geometry.py").write_text(USERS_OWN, encoding="utf-8")
    (cwd / "conf").mkdir()
    (cwd / "conf" / "train.yaml").write_text("defaults:\n  - not_a_tgo_group: nothing\n", encoding="utf-8")
    assert not cwd.resolve().is_relative_to(REPO) and not site.resolve().is_relative_to(REPO)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(
        PYTHONPATH=str(site),
        TGO_ROOT=str(cwd),
        PYTHONNOUSERSITE="1",
        PATH=f"{site / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),  # two xdist workers share the cores
    )

    def run(command: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
        began = time.monotonic()
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        shown = " ".join([Path(command[0]).name, *("<probe>" if a == PROBE else a for a in command[1:])])
        seconds = time.monotonic() - began
        print(f"$ {shown}  -> exit {result.returncode} in {seconds:.1f} s".replace(str(tmp_path), "<tmp>"))
        for line in tgo_lines(result.stdout + result.stderr):
            print(f"    {line}".replace(str(tmp_path), "<tmp>"))
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        return result

    # Proof, in the same environment the commands get, that nothing resolves to the checkout, although the venv's
    # editable install (when there is one) maps `tgo` to it: PYTHONPATH's PathFinder comes before that finder.
    probe = json.loads(run([sys.executable, "-c", PROBE], timeout=120).stdout.strip().splitlines()[-1])
    for key, value in probe.items():
        print(f"    {key}: {value}".replace(str(tmp_path), "<tmp>"))
    for key in ("tgo", "tgo.callbacks", "tgo.callbacks.spectral_geometry", "tgo.conf", "tgo.conf train.yaml"):
        path = Path(probe[key]).resolve()
        assert path.is_relative_to(site.resolve()) and not path.is_relative_to(REPO), f"{key} -> {path}"
    assert Path(probe["tgo metadata"]).resolve() == (site / "tgo").resolve()
    assert Path(probe["tgo.callbacks"]).resolve() == (site / "tgo" / "callbacks" / "__init__.py").resolve()
    assert "pkg://tgo.conf" in probe["hydra config sources"] and not probe["top-level callbacks imported"]
    assert probe["composed experiment"] == "smoke"
    assert probe["callback target"] == "tgo.callbacks.spectral_geometry.SpectralGeometryCallback"

    # The README's smoke pipeline (its block marked `runnable: wheel`), as a reader who installed TGO runs it.
    (readme_block,) = [block for block in README_BLOCKS if block.wheel]
    (cwd / "readme_block.sh").write_text(readme_block.code, encoding="utf-8")
    train = run(["bash", "-euo", "pipefail", "readme_block.sh"])
    run_dir, observed = cwd / "runs" / "smoke", tmp_path / "observed"
    assert any(line.startswith("[tgo] done:") for line in tgo_lines(train.stdout + train.stderr))
    for record in ("config.yaml", "analysis_subset.json", "geometry/metrics.csv", "checkpoints/last.ckpt"):
        assert (run_dir / record).is_file(), record
    assert sorted((run_dir / "geometry" / "spectra").iterdir()), "no spectra recorded"
    assert "tgo.callbacks.spectral_geometry.SpectralGeometryCallback" in (run_dir / "config.yaml").read_text(
        encoding="utf-8"
    )
    assert not (cwd / "outputs").exists()
    assert (run_dir / "report" / "index.html").is_file(), "the README block's report"

    # One checkpoint (the console script and the installed configs are what this checks; --run's trajectory of the
    # run's checkpoints is tests/observe/'s).
    last = run_dir / "checkpoints" / "last.ckpt"
    run([str(scripts["tgo-observe"]), "--checkpoint", str(last), "--out", str(observed)])
    assert (observed / "geometry" / "metrics.csv").is_file() and sorted((observed / "geometry" / "spectra").iterdir())

    page = (run_dir / "report" / "index.html").read_text(encoding="utf-8")
    assert (run_dir / "report" / "findings.csv").is_file() and sorted((run_dir / "report" / "figures").iterdir())
    version = PYPROJECT["project"]["version"]
    assert f'tgo version</td><td class="l ">{version}<' in page
    assert 'git commit (report)</td><td class="l ">not recorded<' in page, "an installed copy has no TGO commit"
    print(f"    report page: tgo version {version}, git commit (report): not recorded")
    print(f"installed wheel, from <tmp>/elsewhere (<tmp> = {tmp_path}): {time.monotonic() - started:.1f} s in all")


def test_a_users_own_callbacks_package_does_not_shadow_tgos_in_the_checkout(tmp_path: Path):
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "callbacks" / "__init__.py").write_text("MINE = True\n", encoding="utf-8")
    (tmp_path / "callbacks" / "spectral_geometry.py").write_text(USERS_OWN, encoding="utf-8")
    probe = (
        "import sys\n"
        "from tgo.callbacks.spectral_geometry import SpectralGeometryCallback as C\n"
        "assert 'callbacks' not in sys.modules, 'TGO imported a top-level callbacks package'\n"
        "import callbacks\n"  # the user's own package keeps its name too
        "assert callbacks.MINE\n"
        "print(C.__module__, sys.modules[C.__module__].__file__, callbacks.__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    module, tgo_file, users_file = result.stdout.split()
    assert module == "tgo.callbacks.spectral_geometry"
    assert Path(users_file).resolve() == (tmp_path / "callbacks" / "__init__.py").resolve()
    assert not Path(tgo_file).resolve().is_relative_to(tmp_path.resolve())
