"""``kill -9`` of ``fdattack matrix --jobs 2`` leaves no process behind: its pool workers (and, isolated, their zygotes
and attack workers) die with it instead of finishing their simulations under init and idling there (issue 57)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_matrix import QUICK, matrix_file


def _parents() -> dict[int, int]:
    """Every live process's parent, by pid (zombies, which are dead, left out)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if state != "Z":
                parents[int(entry.name)] = int(ppid)
    return parents


def _descendants(pid: int) -> set[int]:
    parents, found, frontier = _parents(), set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.parametrize("isolation", ["in_process", "process"])
def test_a_killed_matrix_leaves_no_worker_behind(tmp_path: Path, isolation: str) -> None:
    path = matrix_file(tmp_path, overrides=[*QUICK, "protocol.rounds=50"], protocols={"fedmd": ["protocol=fedmd"]}, defenses={"none": []})
    root = tmp_path / "root"
    command = [sys.executable, "-m", "fdattack", "matrix", str(path), "--root", str(root), "--jobs", "2", "--isolation", isolation]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    matrix = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not all((root / f"digits/fedmd/none/seed_{s}/rounds.jsonl").is_file() for s in (0, 1)):  # both simulations run
            assert matrix.poll() is None and time.monotonic() < deadline, "the matrix ended or took too long to start"
            time.sleep(0.5)
        workers = _descendants(matrix.pid)
        assert len(workers) >= 2
        os.kill(matrix.pid, signal.SIGKILL)
        matrix.wait()
        deadline = time.monotonic() + 20
        while workers & set(_parents()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not workers & set(_parents()), "processes of the killed matrix still run"
    finally:
        if matrix.poll() is None:
            os.killpg(matrix.pid, signal.SIGKILL)
