"""One process per run directory (issue 33): the lock every writer takes, its refusal, and stale locks recovered.

The process that holds the lock here is a real second interpreter (it imports only ``tgo.run_lock``, so it starts in
well under a second): the lock is about processes, and an ``flock`` held by the same process would not show it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tgo.run_lock import LOCK_NAME, RunLock, RunLockError, launcher_rank

REPO = Path(__file__).resolve().parents[1]

HOLD = """
import sys, time
from tgo.run_lock import RunLock
RunLock(sys.argv[1], what="test").acquire()
print("held", flush=True)
time.sleep(120)
"""


@contextlib.contextmanager
def holding_lock(run: Path) -> Iterator[subprocess.Popen[str]]:
    """A second process holding ``run``'s lock (as a running tgo.train would) until the block ends or it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A second process that holds ``tmp_path/run``'s lock until it is killed."""
    run = tmp_path / "run"
    with holding_lock(run) as proc:
        yield run, proc


def _stamp(run: Path, **fields: object) -> None:
    """A lock file as another process left it (its flock gone with it)."""
    run.mkdir(parents=True, exist_ok=True)
    since = "2026-12-01T00:00:00+00:00"
    payload = {"tgo": "run directory lock", "pid": 1, "host": socket.gethostname(), "since": since, "command": "x"}
    (run / LOCK_NAME).write_text(json.dumps({**payload, **fields}), encoding="utf-8")


def test_a_second_process_is_refused_in_one_line_naming_the_holder(holder):
    run, proc = holder
    stamp = json.loads((run / LOCK_NAME).read_text(encoding="utf-8"))
    assert stamp["pid"] == proc.pid and stamp["host"] == socket.gethostname() and "-c" in stamp["command"]
    with pytest.raises(RunLockError) as refused:
        RunLock(run, what="hydra.run.dir").acquire()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"hydra.run.dir '{run}' is in use by another TGO process (pid {proc.pid} on host ")
    assert f"since {stamp['since']}" in message and "one process per run directory" in message
    assert json.loads((run / LOCK_NAME).read_text(encoding="utf-8")) == stamp, "the holder's lock file is untouched"


def test_the_lock_of_a_killed_process_is_taken_over_with_one_line(holder, capsys: pytest.CaptureFixture[str]):
    run, proc = holder
    proc.send_signal(signal.SIGKILL)  # no release: the file stays, naming a pid that no longer runs
    proc.wait()
    assert (run / LOCK_NAME).is_file()
    lock = RunLock(run, what="hydra.run.dir").acquire()
    try:
        assert lock.took_over is not None and f"took over the lock of pid {proc.pid} on host" in lock.took_over
        assert "which is no longer running" in lock.took_over
        assert capsys.readouterr().err.strip().splitlines() == [lock.took_over]
        assert json.loads((run / LOCK_NAME).read_text(encoding="utf-8"))["pid"] == os.getpid()
    finally:
        lock.release()
    assert not (run / LOCK_NAME).exists(), "released: the file is gone"


def test_released_on_exit_of_the_block_an_exception_included_and_reentrant_in_one_process(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(KeyError), RunLock(run):
        inner = RunLock(run, what="trainer.default_root_dir").acquire()  # tgo.train holds it, then its callback
        inner.release()
        assert (run / LOCK_NAME).is_file(), "the outer hold keeps it"
        raise KeyError("a failure inside the run")
    assert not (run / LOCK_NAME).exists()
    with RunLock(run):  # free again
        pass


def test_a_directory_made_only_for_the_lock_is_removed_again(tmp_path: Path):
    new = tmp_path / "new" / "run"
    with RunLock(new):
        assert new.is_dir()
    assert not new.exists(), "nothing was written there: the directory the lock made is gone"
    with RunLock(new):
        (new / "record").write_text("kept", encoding="utf-8")
    assert (new / "record").read_text(encoding="utf-8") == "kept"


def test_another_hosts_lock_is_refused_with_what_to_do_unless_it_is_this_slurm_jobs(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    _stamp(run, host="node-17", pid=4242, slurm_job="991")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(RunLockError) as refused:
        RunLock(run).acquire()
    assert (
        "locked by pid 4242 on host node-17 (since 2026-12-01T00:00:00+00:00), which this host cannot check; if "
        in (str(refused.value))
    )
    assert str(refused.value).endswith(f"delete {run / LOCK_NAME} and start again")
    monkeypatch.setenv("SLURM_JOB_ID", "991")  # the requeued job, started on another node
    with RunLock(run) as lock:
        assert lock.took_over is not None and "an earlier start of this SLURM job (991, requeued)" in lock.took_over
    assert "took over" in capsys.readouterr().err


def test_a_process_the_holder_started_writes_under_its_lock(tmp_path: Path):
    """The ranks of ``strategy=ddp_spawn`` are children of tgo.train, which holds the lock: the callback's rank 0
    runs there and must not be refused by its own launcher (tests/test_ddp.py trains that way)."""
    run = tmp_path / "run"
    child = "import sys; from tgo.run_lock import RunLock; RunLock(sys.argv[1]).acquire().release(); print('wrote')"
    with RunLock(run):
        stamp = (run / LOCK_NAME).read_text(encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "-c", child, str(run)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            check=False,
        )
        assert done.returncode == 0 and done.stdout.strip() == "wrote", done.stderr
        assert (run / LOCK_NAME).read_text(encoding="utf-8") == stamp, (
            "the child neither took nor removed its launcher's lock"
        )
    assert not (run / LOCK_NAME).exists()


def test_a_grandchild_writes_under_its_lock_through_a_parent_whose_name_is_not_utf8(tmp_path: Path):
    """The walk up to the holder reads each ancestor's ``/proc/PID/stat``, whose process name is bytes the process
    chose, cut at 15 (a UTF-8 name can end mid-character): a name that is not UTF-8 must not stop the walk."""
    run = tmp_path / "run"
    grandchild = "import sys; from tgo.run_lock import RunLock; RunLock(sys.argv[1]).acquire().release(); print('ok')"
    middle = (
        "import subprocess, sys\n"
        "open('/proc/self/comm', 'wb').write(b'tgo-\\xe2\\x82')  # a UTF-8 name cut inside its euro sign\n"
        "sys.exit(subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]]).returncode)"
    )
    with RunLock(run):
        done = subprocess.run(
            [sys.executable, "-c", middle, grandchild, str(run)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            check=False,
        )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_link_or_a_directory_as_the_lock_file_is_one_line(tmp_path: Path):
    outside = tmp_path / "outside.txt"
    outside.write_text("theirs", encoding="utf-8")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / LOCK_NAME).symlink_to(outside)
    with pytest.raises(RunLockError, match=rf"{LOCK_NAME} is a symbolic link; TGO never writes through a link"):
        RunLock(linked).acquire()
    assert outside.read_text(encoding="utf-8") == "theirs"
    folder = tmp_path / "folder"
    (folder / LOCK_NAME).mkdir(parents=True)
    with pytest.raises(RunLockError, match=f"{LOCK_NAME} is a directory"):
        RunLock(folder).acquire()


def test_launcher_rank_reads_the_launchers_environment(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert launcher_rank() == 0
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert launcher_rank() == 3
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's re-launch of rank 1 wins over SLURM's task id
    assert launcher_rank() == 1


def test_a_check_before_anything_is_written_sees_a_held_lock_without_taking_it(holder, tmp_path: Path):
    run, proc = holder
    stamp = (run / LOCK_NAME).read_bytes()
    refusal = RunLock(run, what="hydra.run.dir").refusal()
    assert refusal is not None and f"(pid {proc.pid} on host " in refusal
    assert (run / LOCK_NAME).read_bytes() == stamp
    assert RunLock(tmp_path / "free").refusal() is None and not (tmp_path / "free").exists()
    proc.kill()
    proc.wait()
    assert RunLock(run).refusal() is None, "a killed holder's lock is free (acquire takes it over)"


# ------------------------------------------------------------------------------------- the callback in a user's fit
def test_the_callback_in_a_users_own_fit_holds_the_lock_while_it_trains_and_releases_it(tmp_path: Path):
    import lightning as L
    from torch.utils.data import DataLoader

    from tests.test_library_use import FAST, Classifier, images, trainer
    from tgo.callbacks import SpectralGeometryCallback
    from tgo.data import stratified_subset

    seen: list[dict[str, object]] = []

    class Watch(L.Callback):
        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            seen.append(json.loads((tmp_path / LOCK_NAME).read_text(encoding="utf-8")))

    class Fails(Classifier):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("the user's step failed")

    analysis = stratified_subset(images(24), per_class=3, seed=0)
    callback = SpectralGeometryCallback(analysis=analysis, every_n_epochs=1, **FAST)
    fitting = trainer(tmp_path, callback)
    fitting.callbacks.append(Watch())
    fitting.fit(Classifier("backbone"), DataLoader(images(8, seed=1), batch_size=4))
    assert [(s["pid"], s["host"]) for s in seen] == [(os.getpid(), socket.gethostname())], "held during the fit"
    assert not (tmp_path / LOCK_NAME).exists(), "released at its end"
    with pytest.raises(RuntimeError, match="the user's step failed"):
        trainer(tmp_path, callback).fit(Fails("backbone"), DataLoader(images(8, seed=1), batch_size=4))
    assert not (tmp_path / LOCK_NAME).exists(), "released after an exception too"


def test_the_callback_refuses_a_directory_another_process_writes_before_any_step(tmp_path: Path):
    from tests.test_library_use import FAST, Classifier, fails_in_setup, images
    from tgo.callbacks import SpectralGeometryCallback
    from tgo.data import stratified_subset
    from tgo.observatory.standalone import RunDirectoryError

    run = tmp_path / "run"
    analysis = stratified_subset(images(24), per_class=3, seed=0)
    with holding_lock(run) as first:
        callback = SpectralGeometryCallback(analysis=analysis, every_n_epochs=1, **FAST)
        message = fails_in_setup(run, Classifier("backbone"), callback, RunDirectoryError, "is in use by another")
        assert message.startswith(f"trainer.default_root_dir '{run}' is in use by another TGO process (pid {first.pid}")
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME], "nothing recorded"
