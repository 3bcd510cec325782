"""Where a report is written: a directory TGO may replace, built whole beside it and then swapped in as one unit.

Written in place, a report stopped half-way would leave a page of one run beside figures of another, and a link planted
in the directory would be written through. So `staged_report` builds it in a fresh temporary sibling and swaps it in
when complete (``renameat2(RENAME_EXCHANGE)`` where Linux has it, else two renames with signals held); an interrupted
report leaves the old one whole. `claim_report_dir` decides first whether the output may be replaced."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tgo.report.html import GENERATOR
from tgo.report.runs import ReportInputError

__all__ = ["REPORT_FILES", "REPORT_MARKER", "claim_report_dir", "staged_report"]

REPORT_MARKER = ".tgo-report"
"""Written into every report directory: a later report may replace what is there, nothing else may be replaced."""
REPORT_FILES = frozenset({REPORT_MARKER, "index.html", "findings.csv", "hypotheses.csv", "figures"})
"""Everything a report writes at its top level (figures are ``figures/*.png``)."""

_BUILDING = ".tgo-building-"
_REPLACED = ".tgo-replaced-"
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.tgo-(?:building|replaced)-(?P<pid>\d+)-")
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100
_HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def claim_report_dir(report_dir: Path) -> None:
    """Refuses, in one line and before anything is written, an output directory a report may not replace: one that is
    not empty, holds anything but what a report writes, or carries neither `REPORT_MARKER` nor an older TGO page, or any
    symbolic link (a report never writes through a link nor replaces one)."""
    if report_dir.is_symlink():
        raise ReportInputError(
            f"report output {report_dir} is a symbolic link (to {os.readlink(report_dir)}); a report never writes "
            "through a link: give the real directory, or another --out"
        )
    if report_dir.exists() and not report_dir.is_dir():
        raise ReportInputError(f"report output {report_dir} is a file; expected a directory (give another --out)")
    if not report_dir.is_dir():
        return
    entries = {entry.name for entry in report_dir.iterdir()}
    if not entries:
        return
    linked = sorted(p.name for p in report_dir.iterdir() if p.is_symlink())
    figures = report_dir / "figures"
    if figures.is_dir() and not figures.is_symlink():
        linked += sorted(f"figures/{p.name}" for p in figures.iterdir() if p.is_symlink())
    if linked:
        raise ReportInputError(
            f"report output {report_dir} holds symbolic links ({', '.join(linked[:3])}); a report never writes "
            "through a link nor replaces one it did not create: remove them, or give another --out"
        )
    index = report_dir / "index.html"
    page = index.read_text(errors="replace", encoding="utf-8") if index.is_file() else ""
    ours = REPORT_MARKER in entries or "TGO report" in page or f'content="{GENERATOR}"' in page
    foreign = sorted(entries - REPORT_FILES)
    if figures.is_dir():
        foreign += sorted(f"figures/{p.name}" for p in figures.iterdir() if not (p.is_file() and p.suffix == ".png"))
    elif figures.exists():
        foreign.append("figures")
    if foreign or not ours:
        named = foreign or sorted(entries)
        shown = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
        raise ReportInputError(
            f"report output {report_dir} already holds files TGO did not write ({shown}); give another --out or an "
            "empty directory (a report never replaces a file it did not create)"
        )


@contextlib.contextmanager
def staged_report(report_dir: Path) -> Iterator[Path]:
    """Yields a fresh temporary directory beside ``report_dir`` and swaps it in when the block ends without an error; on
    an error (or a signal turned into one) it is removed and the old report is left as it was."""
    parent = report_dir.absolute().parent
    _remove_leftovers(parent, report_dir.name)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{report_dir.name}{_BUILDING}{os.getpid()}-", dir=parent))
        stage.chmod(0o777 & ~_umask())
        (stage / REPORT_MARKER).touch()
    except OSError as err:
        raise ReportInputError(_unwritable(report_dir, parent, err)) from err
    try:
        yield stage
        _swap_in(stage, report_dir.absolute())
    except OSError as err:
        raise ReportInputError(_unwritable(report_dir, parent, err)) from err
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _unwritable(report_dir: Path, parent: Path, err: OSError) -> str:
    why = "a read-only filesystem" if err.errno == errno.EROFS else err.strerror or type(err).__name__
    return (
        f"report output {report_dir}: cannot write in {parent} ({why}); a report is built beside its directory and "
        "then put in place: give a writable --out (nothing was changed)"
    )


def _swap_in(stage: Path, report_dir: Path) -> None:
    """Puts the complete ``stage`` where ``report_dir`` is, then removes the old report (if there was one)."""
    old = None
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        if not report_dir.exists():
            os.rename(stage, report_dir)
        elif _exchange(stage, report_dir):
            old = stage  # the old report now lives at the stage's name
        else:
            old = report_dir.with_name(f".{report_dir.name}{_REPLACED}{os.getpid()}-{os.urandom(4).hex()}")
            os.rename(report_dir, old)
            os.rename(stage, report_dir)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchanges two paths (Linux ``renameat2``); ``False`` where that is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a filesystem or kernel without it
        return False
    raise OSError(code, os.strerror(code), str(b))


def _remove_leftovers(parent: Path, name: str) -> None:
    """Removes what a report killed outright (``kill -9``) left beside ``name``: its building or replaced directory,
    when the process that made it no longer runs."""
    if not parent.is_dir():
        return
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            found = _LEFTOVER.match(entry.name)
            mine = found is not None and found["name"] == name and entry.is_dir() and not entry.is_symlink()
            if mine and found is not None and not _alive(int(found["pid"])):
                shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
