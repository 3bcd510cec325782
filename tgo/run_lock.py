"""One process per run directory: the lock every writer of a run takes (``<run>/.tgo-lock``).

Without it two trainings in one directory would interleave their records, and a resume of a run still training would
train it twice; a second process is refused in one line naming the holder. It is an ``flock`` (released however the
process ends) on a file holding the holder's identity, so a stale file is taken over when its pid is dead on this host
or it is this SLURM job's, and another host's is refused. Re-entrant within a process and its ``ddp_spawn`` children.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tgo.errors import RunEnvironmentError

__all__ = ["LOCK_NAME", "RunLock", "RunLockError", "launcher_rank"]

LOCK_NAME = ".tgo-lock"
"""The lock file in a run directory, next to the `tgo.records.RunDir.marker`."""

_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Where a launcher says a process's rank before any process group exists (the order Lightning reads them in)."""

_NO_FLOCK = frozenset({errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})


class RunLockError(RunEnvironmentError):
    """Another process writes this run directory (or its lock file cannot be used): one line, nothing written."""


def launcher_rank() -> int:
    """This process's rank as its launcher set it in the environment (0 when none did: the launching process)."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return 0


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a run directory's lock, as its lock file says."""

    pid: int
    host: str
    since: str
    command: str
    slurm_job: str | None = None

    @classmethod
    def of_this_process(cls) -> Holder:
        command = " ".join([Path(sys.executable).name, *sys.argv])
        return cls(
            pid=os.getpid(),
            host=socket.gethostname(),
            since=datetime.now().astimezone().isoformat(timespec="seconds"),
            command=command if len(command) <= 160 else command[:157] + "...",
            slurm_job=os.environ.get("SLURM_JOB_ID"),
        )

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder a lock file names, or ``None`` for an empty or unreadable one (a holder mid-write)."""
        try:
            data = json.loads(text)
            job = data.get("slurm_job")
            return cls(
                int(data["pid"]),
                str(data["host"]),
                str(data["since"]),
                str(data.get("command", "")),
                None if job is None else str(job),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, since {self.since}: {self.command}"

    def is_alive_here(self) -> bool:
        """Whether a process with this pid runs on this host (a pid of another user's process counts as alive)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


@dataclass
class _Held:
    fd: int  # -1: borrowed from the process that started this one (it holds the flock)
    count: int
    made_dir: bool


_HELD: dict[str, _Held] = {}
_HELD_GUARD = threading.Lock()


class RunLock:
    """The lock of one run directory (``with RunLock(root):`` or `acquire` / `release`); ``what`` names it in messages,
    ``create`` makes the directory (removed on release if still empty)."""

    def __init__(self, root: str | os.PathLike[str], *, what: str = "the run directory", create: bool = True) -> None:
        self.root = Path(root)
        self.what = what
        self.create = create
        self.took_over: str | None = None
        self._held = False

    @property
    def path(self) -> Path:
        """``<root>/.tgo-lock``."""
        return self.root / LOCK_NAME

    def refusal(self) -> str | None:
        """The refusal `acquire` would give now, without taking the lock or writing anything (``None``: free)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None  # no lock file (or one `acquire` refuses in its own words)
        try:
            if self._key() in _HELD or not _is_regular(fd):
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = Holder.parse(_read(fd))
                return None if holder is not None and _started_by(holder) else self._refusal(holder, busy=True)
            except OSError:
                return None
            return None
        finally:
            os.close(fd)  # drops the shared flock with it

    def _key(self) -> str:
        return os.path.realpath(self.root)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> RunLock:
        """Takes the lock, or raises `RunLockError` naming the holder or what is wrong with the file; idempotent."""
        if self._held:
            return self
        with _HELD_GUARD:
            key = self._key()
            held = _HELD.get(key)
            if held is not None:  # this process holds it already (tgo.train, then its callback)
                held.count += 1
                self._held = True
                return self
            made_dir = False
            if not self.root.exists() and self.create:
                try:
                    self.root.mkdir(parents=True)
                    made_dir = True
                except OSError as err:
                    raise RunLockError(f"{self.what} '{self.root}' cannot be made ({err.strerror})") from err
            fd = self._lock_file()
            _HELD[self._key()] = _Held(fd, 1, made_dir)
            self._held = True
            return self

    def _lock_file(self) -> int:
        """Opens, locks and stamps the lock file; returns its descriptor (-1: borrowed from the parent holding it)."""
        for _ in range(20):  # a holder releasing (unlinking) between our open and flock: open the new file
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as err:
                raise RunLockError(self._unusable(err)) from err
            try:
                if not _is_regular(fd):
                    raise RunLockError(
                        f"{self.what} '{self.root}': {LOCK_NAME} is not a regular file; expected TGO's lock file "
                        "(or none): remove it, or choose another directory"
                    )
                locked = _flock(fd)
                if locked is False:
                    holder = Holder.parse(_read(fd))
                    if holder is not None and _started_by(holder):
                        os.close(fd)
                        return -1  # a worker the holder started (DDP spawn): it writes under its launcher's lock
                    raise RunLockError(self._refusal(holder, busy=True))
                if not _same_file(fd, self.path):
                    os.close(fd)
                    continue
                previous = Holder.parse(_read(fd))
                if previous is not None:
                    self._check_stale(previous, flocked=locked is True)
                _stamp(fd, Holder.of_this_process())
                return fd
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
        raise RunLockError(f"{self.what} '{self.root}': its lock file keeps changing; another process races for it")

    def _check_stale(self, previous: Holder, *, flocked: bool) -> None:
        """Takes over what a killed process left (one line), or refuses a holder that may still run."""
        me = Holder.of_this_process()
        if previous.pid == me.pid and previous.host == me.host:
            return
        if previous.host == me.host:
            if not flocked and previous.is_alive_here() and not _started_by(previous):  # no flock: the pid decides
                raise RunLockError(self._refusal(previous, busy=True))
            why = "is no longer running" if not previous.is_alive_here() else "no longer holds it"
        elif previous.slurm_job is not None and previous.slurm_job == me.slurm_job:
            why = f"was an earlier start of this SLURM job ({me.slurm_job}, requeued)"
        else:
            raise RunLockError(self._refusal(previous, busy=False))
        self.took_over = (
            f"[tgo] {self.what} '{self.root}': took over the lock of pid {previous.pid} on host {previous.host} "
            f"(since {previous.since}), which {why}"
        )
        print(self.took_over, file=sys.stderr)

    def _refusal(self, holder: Holder | None, *, busy: bool) -> str:
        if holder is None:
            return (
                f"{self.what} '{self.root}' is in use by another TGO process (its {LOCK_NAME} is held); one process "
                "per run directory: wait for it to end, or choose another directory"
            )
        if busy:
            return (
                f"{self.what} '{self.root}' is in use by another TGO process ({holder.describe()}); one process per "
                "run directory: wait for it to end, or choose another directory"
            )
        return (
            f"{self.what} '{self.root}' is locked by pid {holder.pid} on host {holder.host} (since {holder.since}), "
            f"which this host cannot check; if that process has ended, delete {self.path} and start again"
        )

    def _unusable(self, err: OSError) -> str:
        if err.errno == errno.ELOOP:
            return (
                f"{self.what} '{self.root}': {LOCK_NAME} is a symbolic link; TGO never writes through a link: remove "
                "it, or choose another directory"
            )
        if err.errno == errno.EISDIR:
            return f"{self.what} '{self.root}': {LOCK_NAME} is a directory; expected TGO's lock file (or none)"
        return f"{self.what} '{self.root}': its lock file {LOCK_NAME} cannot be made ({err.strerror})"

    def release(self) -> None:
        """Releases the lock (this object's hold); the last hold removes the file and drops the ``flock``."""
        if not self._held:
            return
        self._held = False
        with _HELD_GUARD:
            key = self._key()
            held = _HELD.get(key)
            if held is None:
                return
            held.count -= 1
            if held.count > 0:
                return
            del _HELD[key]
            if held.fd < 0:  # borrowed: the launcher releases it
                return
            with contextlib.suppress(OSError):
                if _same_file(held.fd, self.path):
                    os.unlink(self.path)  # before the flock goes: a waiting process then finds the file gone
            with contextlib.suppress(OSError):
                os.close(held.fd)
            if held.made_dir:
                with contextlib.suppress(OSError):
                    self.root.rmdir()  # only when empty: nothing was written after all


def _started_by(holder: Holder) -> bool:
    """Whether ``holder`` is an ancestor of this process on this host (``ddp_spawn`` ranks)."""
    if holder.host != socket.gethostname():
        return False
    pid = os.getpid()
    for _ in range(64):
        pid = _parent_of(pid)
        if pid <= 1:
            return False
        if pid == holder.pid:
            return True
    return False


def _parent_of(pid: int) -> int:
    """The parent's pid (Linux ``/proc``; elsewhere only this process's own parent is known). Read as bytes: the
    process name in ``stat`` is whatever bytes the process set, cut at 15 (a UTF-8 name can end mid-character)."""
    if pid == os.getpid():
        return os.getppid()
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    return int(stat.rsplit(b")", 1)[1].split()[1])


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _flock(fd: int) -> bool | None:
    """``True``: locked; ``False``: another process holds it; ``None``: this filesystem has no flock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in _NO_FLOCK:
            return None
        raise
    return True


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a releasing holder unlinks it)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _stamp(fd: int, holder: Holder) -> None:
    payload = {"tgo": "run directory lock", **dataclasses.asdict(holder)}  # pid, host, since, command, slurm_job
    data = (json.dumps(payload) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)
    os.fsync(fd)
