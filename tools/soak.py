"""``python -m tools.soak`` (``make soak``): randomized ``kill -9`` trials over the smoke experiment (issue 13).

The promise this checks: a training run killed at *any* moment, then launched again with ``ckpt_path=last``, finishes
without a human, records every scheduled epoch exactly once, leaves no damaged file, and its last record describes
the weights of its last checkpoint. A real ``SIGKILL`` lands anywhere, inside a file write included, which only a
randomized soak reaches. docs/benchmarks.md, "Fault-injection soak", describes the kill kinds (`KINDS`) and checks.

One trial plans 1-3 kills (`plan_trial`, seeded by ``--seed``, restricted by ``--kinds``), launches
``python -m tgo.train experiment=smoke`` in its own process group, kills the whole group at the planned moment (file
and log events are polled every couple of milliseconds: `EventWatcher`, `LogWatcher`), relaunches with
``ckpt_path=last`` until a launch exits 0, then checks the run directory (`check_records`, `check_last_record`,
`leftover_files`). A launch that exits non-zero without our kill, or more launches than kills + 3, needed a human.

Prints one line per trial and a final table; exit status 1 when any trial was not survived or found lost, duplicated,
corrupt or mismatched records; 2 for bad usage. The work directory (``--workdir``) is kept unless everything passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from benchmarks._table import render_columns
from tgo.records import RecordsError, RunDir, read_metric_rows

REPO = Path(__file__).resolve().parents[1]
KINDS = ("random", "run_dir", "spectra", "metrics", "geometry_tmp", "ckpt_tmp", "ckpt_replaced", "summary")
FILE_KINDS = KINDS[1:-1]
LOG_KINDS = ("summary",)
FAST = (
    "experiment=smoke",
    "observation.summary.background=true",  # the default, named so that the soak kills what it says it kills
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "observation.figures.spectra=false",
    "observation.figures.histograms=false",
    "observation.figures.heatmaps=false",
    "observation.figures.decay=false",
    "observation.figures.layer_epoch=false",
)
"""The smoke experiment as every launch runs it: TensorBoard figures off and fewer batches keep a launch short (most
of a launch is then Python start-up and the observations, i.e. the moments worth killing)."""
RTOL = 1e-10
POLL_S = 0.002
SUMMARY_DELAY_S = 0.3
"""A ``summary`` kill lands ``fraction * SUMMARY_DELAY_S`` after its line: well inside the summary (0.5-6 s in the
smoke experiment), and on either side of the ``last.ckpt`` saved some tens of milliseconds after an observation."""
SUMMARY_LINE = re.compile(r"\[tgo\] geometry of epoch (\d+) streamed and reduced .*?; summary in the background")
EXTRA_LAUNCHES = 3  # launches allowed beyond one per planned kill before the trial counts as needing a human


# --------------------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Kill:
    """One planned kill: its ``kind`` (`KINDS`), the ``nth`` file or log event of that kind to kill at, and the
    ``fraction`` of the expected run time after the launch at which to kill (``random``) or of `SUMMARY_DELAY_S`
    after the event (``summary``)."""

    kind: str
    nth: int = 1
    fraction: float = 0.0

    @property
    def delay_s(self) -> float:
        """Seconds from the event to the kill (``summary`` only)."""
        return self.fraction * SUMMARY_DELAY_S if self.kind == "summary" else 0.0

    def describe(self, expected_s: float) -> str:
        """``random@12.3s``, ``spectra#2`` or ``summary#2+0.12s``."""
        if self.kind == "random":
            return f"random@{self.fraction * expected_s:.1f}s"
        if self.kind == "summary":
            return f"summary#{self.nth}+{self.delay_s:.2f}s"
        return f"{self.kind}#{self.nth}"


def plan_trial(rng: random.Random, max_epochs: int, kinds: Sequence[str] = KINDS) -> list[Kill]:
    """1-3 kills, each of a random kind of ``kinds``; the n-th event is drawn from the events a launch can still
    produce.

    A first launch observes epochs 0 .. max_epochs and saves max_epochs checkpoints; a relaunch has fewer left, so
    its n is drawn from the first two events (an n it never reaches lets it finish, which the log shows). Only the
    first launch creates the run directory, so only its kill can be ``run_dir`` (``kinds=("run_dir",)`` plans one
    kill).
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"kinds: {unknown or 'none'}; expected some of {KINDS}")
    later = tuple(k for k in kinds if k != "run_dir")
    kills = []
    for i in range(rng.randint(1, 3) if later else 1):
        kind = rng.choice(tuple(kinds) if i == 0 else later)
        if kind == "run_dir":
            events = 1
        elif kind in ("spectra", "metrics", "geometry_tmp", "summary"):
            events = max_epochs + 1
        else:
            events = max(max_epochs, 1)
        nth = rng.randint(1, events if i == 0 else min(2, events))
        kills.append(Kill(kind, nth=nth, fraction=rng.random()))
    return kills


# ------------------------------------------------------------------------------------------------------ file events
def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _listed(d: Path, prefix: str, suffix: str) -> list[str]:
    """The names in ``d`` with ``prefix`` and ``suffix`` (none while ``d`` does not exist)."""
    with contextlib.suppress(OSError):
        return [e.name for e in os.scandir(d) if e.name.startswith(prefix) and e.name.endswith(suffix)]
    return []


class EventWatcher:
    """Counts file events of one kind in a run directory, by comparing snapshots taken at each `poll`.

    A file that appears or is replaced (``os.replace`` gives it a new inode) counts once; for the ``*_tmp`` kinds each
    distinct temporary file name seen counts once (``mkstemp`` names are unique per write). Create it before the launch
    starts: the files already there are its baseline.
    """

    def __init__(self, run_dir: Path, kind: str) -> None:
        if kind not in FILE_KINDS:
            raise ValueError(f"kind: {kind!r} is not a file event; expected one of {FILE_KINDS}")
        self.run, self.kind, self.count = RunDir(run_dir), kind, 0
        self.last_tmp: str | None = None
        self._seen: dict[str, object] = self._snapshot()  # what an earlier launch left is not an event of this one

    def _snapshot(self) -> dict[str, object]:
        run = self.run
        if self.kind == "spectra":
            return {name: _signature(run.spectra_dir / name) for name in _listed(run.spectra_dir, "epoch_", ".npz")}
        if self.kind == "metrics":
            return {"metrics.csv": _signature(run.metrics)}
        if self.kind == "ckpt_replaced":
            return {"last.ckpt": _signature(run.last_checkpoint)}
        if self.kind == "run_dir":
            return {".hydra": True} if (run.root / ".hydra").is_dir() else {}
        dirs = (run.geometry, run.spectra_dir) if self.kind == "geometry_tmp" else (run.checkpoints,)
        return {str(d / name): True for d in dirs for name in _listed(d, "", ".tmp")}

    def poll(self) -> int:
        """Takes a snapshot and returns the number of events seen so far."""
        now = self._snapshot()
        for name, sig in now.items():
            if sig is not None and self._seen.get(name) != sig:
                if self.kind.endswith("_tmp"):
                    if name in self._seen:
                        continue
                    self.last_tmp = name
                self.count += 1
        self._seen.update(now)
        return self.count


class LogWatcher:
    """Counts the ``... summary in the background`` lines (`SUMMARY_LINE`) a launch writes to its log, by reading
    what was appended since the last `poll`; remembers the epoch of the last one, and what ``last.ckpt`` was then.

    Create it once the log holds the command line and before the launch starts: what is already there is not an
    event. Lightning's progress bar may share a line with the message, so matches are searched in the text, not
    per line; a message split across two reads is found whole in the second.
    """

    def __init__(self, log: Path, run_dir: Path) -> None:
        self.log, self.run, self.count = log, RunDir(run_dir), 0
        self.epoch: int | None = None
        self._checkpoint_then: tuple[int, int, int] | None = None
        self._offset = log.stat().st_size if log.exists() else 0
        self._pending = ""  # the text after the last match, which may hold the start of the next one

    def poll(self) -> int:
        """Reads the new output and returns the number of summary lines seen so far."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return self.count
        if not chunk:
            return self.count
        self._offset += len(chunk)
        text = self._pending + chunk.decode(errors="replace")
        end = 0
        for match in SUMMARY_LINE.finditer(text):
            self.count += 1
            self.epoch, end = int(match.group(1)), match.end()
            self._checkpoint_then = _signature(self.run.last_checkpoint)
        self._pending = text[end:][-4096:]
        return self.count

    def landed(self) -> str:
        """Where the kill landed, once the process is dead: whether the last line's epoch had its records in
        ``metrics.csv`` and whether ``last.ckpt`` had been replaced since that line."""
        if self.epoch is None:
            return "no summary line seen"
        try:
            in_metrics = self.epoch in {int(r["epoch"]) for r in read_metric_rows(self.run.root)}
        except (RecordsError, OSError, ValueError, KeyError):
            in_metrics = False
        records = "already in" if in_metrics else "not yet in"
        replaced = _signature(self.run.last_checkpoint) != self._checkpoint_then
        return (
            f"epoch {self.epoch}'s records {records} metrics.csv, last.ckpt "
            f"{'replaced' if replaced else 'not replaced'} since its line"
        )


# --------------------------------------------------------------------------------------------------------- launches
@dataclass
class Launch:
    """What one launch did: exit status (negative: the signal that ended it), whether our kill ended it, its wall
    time, and where the kill landed."""

    index: int
    returncode: int
    killed: bool
    seconds: float
    planned: str | None = None
    landed: str | None = None
    last_line: str = ""
    left: str = ""
    """What the run directory held when the launch ended (top level), e.g. ``.hydra, train.log``."""


def train_command(run_dir: Path, max_epochs: int, *, resume: bool, overrides: Sequence[str] = ()) -> list[str]:
    """``python -m tgo.train experiment=smoke ... hydra.run.dir=<run>`` [``ckpt_path=last``]."""
    args = [*FAST, f"trainer.max_epochs={max_epochs}", *overrides, f"hydra.run.dir={run_dir}"]
    return [sys.executable, "-m", "tgo.train", *args, *(["ckpt_path=last"] if resume else [])]


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def launch(
    trial_dir: Path,
    index: int,
    max_epochs: int,
    kill: Kill | None,
    expected_s: float,
    *,
    overrides: Sequence[str] = (),
    timeout_s: float = 600.0,
) -> Launch:
    """Runs one launch of the trial's run, killing its process group with SIGKILL when ``kill`` says so.

    The launch gets its own session (process group) so the kill takes every process it started, and its own
    ``$TMPDIR`` (``trial_dir/tmp``) so staging files it leaves behind can be counted.
    """
    run_dir, tmp = trial_dir / "run", trial_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    log = trial_dir / f"launch_{index}.log"
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": pythonpath}
    # A kill before Hydra made the run directory leaves nothing to resume (tgo.train refuses ckpt_path=last there, as
    # it refuses a mistyped path): the relaunch is then the first launch again, as a person would do it.
    cmd = train_command(run_dir, max_epochs, resume=index > 0 and run_dir.exists(), overrides=overrides)
    deadline = kill.fraction * expected_s if kill is not None and kill.kind == "random" else math.inf
    start = time.monotonic()
    landed: str | None = None
    with open(log, "wb") as out:
        out.write((" ".join(cmd) + "\n").encode())
        out.flush()
        watcher: EventWatcher | LogWatcher | None = None
        if kill is not None and kill.kind in LOG_KINDS:
            watcher = LogWatcher(log, run_dir)
        elif kill is not None and kill.kind != "random":
            watcher = EventWatcher(run_dir, kill.kind)
        proc = subprocess.Popen(
            cmd, cwd=trial_dir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while proc.poll() is None:
                elapsed = time.monotonic() - start
                if watcher is not None and kill is not None and deadline == math.inf and watcher.poll() >= kill.nth:
                    deadline = elapsed + kill.delay_s  # the event: kill now, or after the summary kill's delay
                due = elapsed >= deadline
                if due or elapsed > timeout_s:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    if not due:
                        landed = f"timeout after {elapsed:.0f}s"
                    elif isinstance(watcher, LogWatcher):
                        landed = f"at {elapsed:.1f}s, {watcher.landed()}"
                    elif watcher is not None and watcher.last_tmp is not None:
                        still = Path(watcher.last_tmp).exists()
                        landed = f"at {elapsed:.1f}s, {'.tmp still there' if still else '.tmp already gone'}"
                    else:
                        landed = f"at {elapsed:.1f}s"
                    break
                if watcher is None or deadline < math.inf:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=max(0.0, min(deadline, timeout_s + 1) - elapsed))
                else:
                    time.sleep(POLL_S)
        finally:
            if proc.poll() is None:  # the driver itself was interrupted: leave nothing running
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.monotonic() - start
    left = ", ".join(sorted(p.name for p in run_dir.iterdir())) if run_dir.is_dir() else "no run directory"
    killed = proc.returncode == -signal.SIGKILL and landed is not None and not landed.startswith("timeout")
    return Launch(
        index,
        proc.returncode,
        killed,
        seconds,
        planned=None if kill is None else kill.describe(expected_s),
        landed=landed,
        last_line=_last_line(log),
        left=left,
    )


# --------------------------------------------------------------------------------------------------------- checking
@dataclass
class Findings:
    """What the checks found in one run directory; empty lists mean the run is as promised."""

    lost: list[int] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    max_rel_diff: float | None = None

    @property
    def failed(self) -> bool:
        """Whether a promise was broken (leftovers are counted, not failures)."""
        return bool(self.lost or self.duplicated or self.corrupt or self.mismatched)


def _read_npz_fully(path: Path) -> dict[str, np.ndarray]:
    """Every array of ``path`` (reading each one checks its CRC and decompresses it)."""
    with np.load(path, allow_pickle=False) as data:
        return {k: np.asarray(data[k]) for k in data.files}


def _corrupt(path: Path) -> str | None:
    """Why ``path`` cannot be read back completely, or ``None``. Spectra, metrics, JSON and checkpoints."""
    try:
        if path.suffix == ".npz":
            _read_npz_fully(path)
        elif path.name == RunDir.METRICS:
            read_metric_rows(path.parent.parent)
        elif path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        elif path.suffix == ".ckpt":
            if not zipfile.is_zipfile(path):
                return "not a torch.save archive (truncated?)"
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            if bad is not None:
                return f"{bad} fails its checksum"
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, RecordsError) as err:
        return f"{type(err).__name__}: {err}"[:200]
    return None


def check_records(run_dir: Path, max_epochs: int) -> Findings:
    """Checks that epochs 0 .. ``max_epochs`` are each recorded exactly once and that no file is damaged.

    Needs no torch: this is the part of the verdict a unit test can feed a hand-made run directory.
    """
    run, found = RunDir(run_dir), Findings()
    for path in sorted(p for p in run.root.rglob("*") if p.is_file() and not p.name.endswith(".tmp")):
        if path.suffix in (".npz", ".json", ".ckpt") or path.name == RunDir.METRICS:
            why = _corrupt(path)
            if why is not None:
                found.corrupt.append(f"{path.relative_to(run.root)}: {why}")
    try:
        rows = read_metric_rows(run.root)
    except RecordsError:
        rows = []  # already counted as corrupt
    counts = Counter((int(r["epoch"]), r["point"], r["view"], r["metric"]) for r in rows)
    found.duplicated += [f"epoch {e} {p}/{v}/{m} x{n}" for (e, p, v, m), n in sorted(counts.items()) if n > 1]
    scheduled = set(range(max_epochs + 1))
    in_rows = {key[0] for key in counts}
    files = run.spectra_files()
    found.duplicated += [f"epoch {e} recorded but not scheduled" for e in sorted((in_rows | set(files)) - scheduled)]
    for epoch in sorted(scheduled):
        if epoch not in in_rows or epoch not in files or _corrupt(files[epoch]) is not None:
            found.lost.append(epoch)
    found.leftovers += leftover_files(run.root)
    return found


def leftover_files(run_dir: Path, tmpdir: Path | None = None) -> list[str]:
    """Files a killed launch left behind: ``.tmp`` files in the run directory, anything in the launches' ``$TMPDIR``,
    and ``best_epoch_*.ckpt`` files beyond the one ``save_top_k=1`` keeps."""
    run = RunDir(run_dir)
    left = [str(p.relative_to(run.root)) for p in sorted(run.root.rglob("*.tmp")) if p.is_file()]
    best = sorted(run.checkpoints.glob("best_epoch_*.ckpt"))
    left += [f"{p.relative_to(run.root)} (one of {len(best)} best checkpoints)" for p in best[:-1]]
    if tmpdir is not None and tmpdir.is_dir():
        left += [f"$TMPDIR/{p.relative_to(tmpdir)}" for p in sorted(tmpdir.rglob("*")) if p.is_file()]
    return left


Reobserve = Callable[[Path, Path], int]
"""``(checkpoint, out) -> epoch``: observes ``checkpoint`` into ``out`` and returns the epoch label it recorded."""


def _observe_checkpoint(checkpoint: Path, out: Path) -> int:
    from tgo.observe import observe_models  # torch and the model stack: imported only when a trial needs it

    (source,) = observe_models(checkpoint=str(checkpoint), out=out)
    return source.epoch


def check_last_record(
    run_dir: Path, max_epochs: int, out: Path, reobserve: Reobserve = _observe_checkpoint
) -> tuple[list[str], float | None]:
    """Re-observes ``last.ckpt`` into ``out`` and compares every point's and view's eigenvalues with the last record:
    the mismatches (none when the record is what the checkpoint holds) and the largest difference relative to its
    spectrum's top eigenvalue."""
    run = RunDir(run_dir)
    if not run.last_checkpoint.is_file():
        return ["no checkpoints/last.ckpt"], None
    epoch = reobserve(run.last_checkpoint, out)
    if epoch != max_epochs:
        return [f"last.ckpt holds epoch {epoch}, the schedule ends at {max_epochs}"], None
    recorded, again = run.spectra(max_epochs), RunDir(out).spectra(max_epochs)
    try:
        a, b = _read_npz_fully(recorded), _read_npz_fully(again)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        return [f"cannot compare epoch {max_epochs}: {err}"], None
    # A view with metrics only (no covariance: attention, the training-only noise scale) has an empty spectrum, and
    # an offline re-observation cannot record what happened between the observations: the covariances are compared.
    keys_a = {k for k in a if k.endswith("/eigenvalues") and a[k].size}
    keys_b = {k for k in b if k.endswith("/eigenvalues") and b[k].size}
    problems = [f"{k} only in the record" for k in sorted(keys_a - keys_b)]
    problems += [f"{k} only in the re-observation" for k in sorted(keys_b - keys_a)]
    worst = 0.0
    for key in sorted(keys_a & keys_b):
        x, y = a[key], b[key]
        if x.shape != y.shape:
            problems.append(f"{key}: shape {x.shape} vs {y.shape}")
            continue
        top = float(np.nanmax(np.abs(x))) if x.size and np.isfinite(x).any() else 0.0
        diff = float(np.nanmax(np.abs(x - y))) if x.size and np.isfinite(x - y).any() else 0.0
        worst = max(worst, diff / top if top > 0 else (0.0 if diff == 0 else math.inf))
        if not np.allclose(y, x, rtol=RTOL, atol=RTOL * top, equal_nan=True):
            problems.append(f"{key}: differs by up to {diff:.3e} (top eigenvalue {top:.3e})")
    return problems, worst


# ------------------------------------------------------------------------------------------------------------ trials
@dataclass
class Trial:
    """One trial's plan, launches and findings."""

    number: int
    kills: list[Kill]
    launches: list[Launch] = field(default_factory=list)
    finished: bool = False
    human: str | None = None
    findings: Findings = field(default_factory=Findings)

    @property
    def survived(self) -> bool:
        """Finished (a launch exited 0) without a human."""
        return self.finished and self.human is None

    @property
    def ok(self) -> bool:
        """Survived with every record as promised."""
        return self.survived and not self.findings.failed

    def line(self) -> str:
        """One line for the log."""
        shots = [
            f"{ln.planned} killed {ln.landed}" if ln.killed else f"{ln.planned} missed (exit {ln.returncode})"
            for ln in self.launches
            if ln.planned is not None
        ]
        f = self.findings
        verdict = "OK" if self.ok else "FAIL"
        parts = [
            f"trial {self.number:02d}: {'; '.join(shots) or 'no kill'}",
            f"{len(self.launches)} launches ({sum(ln.seconds for ln in self.launches):.0f}s)",
        ]
        if self.human:
            parts.append(f"NEEDED A HUMAN: {self.human}")
        elif not self.finished:
            parts.append("did not finish")
        if self.finished:
            rel = "n/a" if f.max_rel_diff is None else f"{f.max_rel_diff:.1e}"
            parts.append(f"lost {len(f.lost)} dup {len(f.duplicated)} corrupt {len(f.corrupt)}")
            parts.append(f"last record vs last.ckpt: {'mismatched' if f.mismatched else 'equal'} (max rel {rel})")
        parts.append(f"leftovers {len(f.leftovers)}")
        return " | ".join(parts) + f" -> {verdict}"


def run_trial(
    number: int,
    trial_dir: Path,
    kills: list[Kill],
    max_epochs: int,
    expected: list[float],
    *,
    overrides: Sequence[str] = (),
    launch_timeout_s: float = 600.0,
) -> Trial:
    """Launches, kills and relaunches one run until it exits 0 (or needs a human), then checks it.

    ``expected`` holds the expected run time in seconds (one element); an uninterrupted first launch updates it.
    """
    trial = Trial(number, kills)
    for index in range(len(kills) + EXTRA_LAUNCHES):
        kill = kills[index] if index < len(kills) else None
        result = launch(
            trial_dir, index, max_epochs, kill, expected[0], overrides=overrides, timeout_s=launch_timeout_s
        )
        trial.launches.append(result)
        if result.returncode == 0:
            trial.finished = True
            if index == 0:
                expected[0] = result.seconds
            break
        if not result.killed:
            why = "timed out" if result.landed else f"exit {result.returncode}"
            trial.human = f"launch {index} {why}: {result.last_line}"
            if index > 0:
                trial.human += f" (the run directory after the kill held: {trial.launches[index - 1].left})"
            break
    else:
        trial.human = f"still not finished after {len(trial.launches)} launches"
    run_dir = trial_dir / "run"
    trial.findings = check_records(run_dir, max_epochs)
    trial.findings.leftovers = leftover_files(run_dir, trial_dir / "tmp")
    if not trial.finished:
        trial.findings.lost = []  # an unfinished run is counted once, as needing a human
    else:
        problems, worst = check_last_record(run_dir, max_epochs, trial_dir / "reobserved")
        trial.findings.mismatched, trial.findings.max_rel_diff = problems, worst
    return trial


COLUMNS = ("trials", "survived", "lost", "duplicated", "corrupt", "mismatched", "needed a human", "leftover files")


def table(trials: Sequence[Trial]) -> str:
    """The final table: trial counts per outcome (lost/duplicated/corrupt/mismatched: trials with any), leftovers
    as a file count."""
    values = (
        len(trials),
        sum(t.survived for t in trials),
        sum(bool(t.findings.lost) for t in trials),
        sum(bool(t.findings.duplicated) for t in trials),
        sum(bool(t.findings.corrupt) for t in trials),
        sum(bool(t.findings.mismatched) for t in trials),
        sum(t.human is not None for t in trials),
        sum(len(t.findings.leftovers) for t in trials),
    )
    return render_columns(COLUMNS, [values], rule=False)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak",
        description="Randomized kill -9 trials over the smoke experiment; resume with ckpt_path=last; check records.",
    )
    parser.add_argument("--trials", type=int, default=20, help="number of trials (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill plans (default 0)")
    parser.add_argument("--max-epochs", type=int, default=3, help="trainer.max_epochs of every run (default 3)")
    parser.add_argument("--workdir", type=Path, default=None, help="where trials run (default: a temporary directory)")
    parser.add_argument(
        "--expected-seconds",
        type=float,
        default=30.0,
        help="run time assumed for random kills until a trial's first launch finishes uninterrupted (default 30)",
    )
    parser.add_argument("--launch-timeout", type=float, default=600.0, help="seconds before a launch counts as hung")
    parser.add_argument(
        "--override", action="append", default=[], help="extra Hydra override for every launch (repeatable)"
    )
    parser.add_argument(
        "--kinds",
        type=lambda text: tuple(k.strip() for k in text.split(",") if k.strip()),
        default=KINDS,
        help=f"comma-separated kill kinds the plans draw from (default all: {','.join(KINDS)})",
    )
    args = parser.parse_args(argv)
    if args.trials < 1 or args.max_epochs < 1 or args.expected_seconds <= 0:
        parser.error("--trials and --max-epochs must be >= 1 and --expected-seconds > 0")
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown or not args.kinds:
        parser.error(f"--kinds: {', '.join(unknown) or 'none given'}; expected some of {', '.join(KINDS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tgo-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    plans = [plan_trial(rng, args.max_epochs, args.kinds) for _ in range(args.trials)]
    kinds = "" if set(args.kinds) == set(KINDS) else f", kinds {','.join(args.kinds)}"
    print(
        f"TGO fault-injection soak: {args.trials} trials, seed {args.seed}, max_epochs {args.max_epochs}{kinds}, "
        f"work directory {workdir}",
        flush=True,
    )
    expected, trials, start = [args.expected_seconds], [], time.monotonic()
    for number, kills in enumerate(plans):
        trial_dir = workdir / f"trial_{number:02d}"
        if trial_dir.exists():
            shutil.rmtree(trial_dir)
        trial = run_trial(
            number,
            trial_dir,
            kills,
            args.max_epochs,
            expected,
            overrides=args.override,
            launch_timeout_s=args.launch_timeout,
        )
        trials.append(trial)
        print(trial.line(), flush=True)
        for problem in [*trial.findings.corrupt, *trial.findings.duplicated, *trial.findings.mismatched][:5]:
            print(f"    {problem}", flush=True)
    landed = Counter(k.kind for t in trials for k, ln in zip(t.kills, t.launches, strict=False) if ln.killed)
    n_launches = sum(len(t.launches) for t in trials)
    by_kind = ", ".join(f"{k} {landed[k]}" for k in KINDS if landed[k])
    print(f"\n{sum(landed.values())} kills landed ({by_kind}), {n_launches} launches, {time.monotonic() - start:.0f} s")
    print(table(trials))
    failed = [t for t in trials if not t.ok]
    (workdir / "results.json").write_text(
        json.dumps([{**asdict(t), "survived": t.survived, "ok": t.ok} for t in trials], indent=1, default=str),
        encoding="utf-8",
    )
    if failed:
        print(f"exit 1: {len(failed)} trial(s) failed: {[t.number for t in failed]}; kept {workdir}")
        return 1
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    print("exit 0: every trial finished without a human, every epoch recorded once, last record = last.ckpt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
