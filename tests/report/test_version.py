"""The report reads its version without writing to any repository (issue 20 item 5)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tgo.report.runinfo import package_commit, package_version

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n", encoding="utf-8")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def touched_since_index(repo: Path) -> int:
    """Makes the work tree's stat data differ from the index (same content), so a refreshing git rewrites it."""
    index = repo / ".git" / "index"
    stat = (repo / "a.py").stat()
    os.utime(repo / "a.py", ns=(stat.st_atime_ns + 10**9, stat.st_mtime_ns + 10**9))
    return index.stat().st_mtime_ns


def test_the_commit_is_read_without_refreshing_or_locking_the_index(repo: Path):
    before = touched_since_index(repo)
    head = git(repo, "rev-parse", "HEAD").strip()
    assert package_commit(repo) == head
    assert (repo / ".git" / "index").stat().st_mtime_ns == before and not (repo / ".git" / "index.lock").exists()
    git(repo, "status", "--porcelain")  # what the report used to run: it rewrites the index
    assert (repo / ".git" / "index").stat().st_mtime_ns != before


def test_a_changed_tree_reads_dirty_and_a_directory_outside_git_reads_none(repo: Path, tmp_path_factory):
    (repo / "a.py").write_text("x = 2\n", encoding="utf-8")
    assert package_commit(repo) == git(repo, "rev-parse", "HEAD").strip() + "+dirty"
    assert package_commit(tmp_path_factory.mktemp("not_a_repo")) is None
    assert package_version()  # from the installed package's metadata
