"""A signal stops ``fdattack matrix`` cleanly (issue 46): SIGTERM or Ctrl-C, to the matrix process alone or to its whole
process group, ends the running simulations at their next safe point, starts no queued one, writes ``matrix.json`` for
what finished, leaves no process behind, says so in one line on stderr and exits 143 / 130; the same command run again
continues and gives the metrics of a matrix that was never stopped.

Before issue 46: ``--jobs 2`` honoured SIGTERM only after every simulation had run (no ``matrix.json``); Ctrl-C to the
group printed "interrupted", then hung with two workers and the resource tracker left behind; ``--jobs 1`` exited 143
with nothing on stderr (the line went to the replica's log).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from fdattack.cli import main

#: 4 simulations (2 defenses x 2 seeds) of 3 rounds each, a checkpoint every round: a few seconds each on this machine
#: (a round takes about 0.15 s; the set-up phases one epoch each, the rest is the interpreter's start)
MATRIX = {
    "name": "stoppable",
    "overrides": [
        "logger.wandb.mode=disabled",
        "logger.progress=never",
        "protocol.num_clients=2",
        "protocol.transfer_public_epochs=1",
        "protocol.transfer_private_epochs=1",
        "protocol.rounds=3",
        "checkpoint_every=1",
        "evaluation.confidence_gap.enabled=false",
        "evaluation.classifier=null",
    ],
    "seeds": [0, 1],
    "data": {"digits": ["data=digits"]},
    "protocols": {"fedmd": ["protocol=fedmd"]},
    "defenses": {"none": [], "laplace": ["defenses=[laplace]", "defense.laplace.scale=1.0"]},
    "attacks": ["ldia"],
}
#: longer than any of these commands needs on a loaded 2-core machine; a command still running then has hung
HUNG_S = 120.0


def matrix_file(folder: Path) -> Path:
    path = folder / "matrix.yaml"
    path.write_text(yaml.safe_dump(MATRIX, sort_keys=False))
    return path


def seed_values(root: Path) -> dict[tuple[str, str], list[float]]:
    """(cell, metric) -> the metric's value at each seed, from ``matrix.json`` (timings left out: they differ run to run)."""
    cells = json.loads((root / "matrix.json").read_text())["cells"]
    return {
        (cell["id"], name): metric["values"] for cell in cells for name, metric in cell["metrics"].items() if not name.startswith("time/")
    }


@pytest.fixture(scope="module")
def uncut(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], list[float]]:
    """The per-seed metrics of the matrix run once without a stop (in this process, one simulation at a time)."""
    folder = tmp_path_factory.mktemp("uncut")
    assert main(["matrix", str(matrix_file(folder)), "--root", str(folder / "root")]) == 0
    return seed_values(folder / "root")


def start(path: Path, root: Path, jobs: int) -> subprocess.Popen[str]:
    """``fdattack matrix`` in its own session (process group = its pid), stdout into a file beside ``root``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(root.parent / f"{root.name}.out", "a", encoding="utf-8") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fdattack", "matrix", str(path), "--root", str(root), "--jobs", str(jobs)],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )


def wait_for_a_round(proc: subprocess.Popen[str], root: Path) -> None:
    """Until a simulation has checkpointed its round 0 (the simulations are running, workers started)."""
    deadline = time.perf_counter() + HUNG_S
    while not any(root.glob("*/*/*/seed_*/checkpoints/round_*.pt")):
        assert proc.poll() is None, f"the matrix ended (exit {proc.returncode}) before it could be stopped: {proc.communicate()}"
        assert time.perf_counter() < deadline, "no simulation recorded a round"
        time.sleep(0.05)


def group_members(pgid: int) -> dict[int, str]:
    """pid -> command line of every live process in process group ``pgid`` (workers and resource tracker keep the group of
    the matrix process that started them, even once it is gone)."""
    members = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        state, _, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members[int(entry.name)] = cmdline
    return members


def left_behind(pgid: int) -> dict[int, str]:
    """The processes of the group still alive 10 s after the matrix process exited (none when it stopped cleanly)."""
    deadline = time.perf_counter() + 10.0
    while (members := group_members(pgid)) and time.perf_counter() < deadline:
        time.sleep(0.1)
    return members


def stop(proc: subprocess.Popen[str], signum: int, whole_group: bool, workers: int) -> tuple[int | None, str, dict[int, str]]:
    """Send ``signum`` to the matrix process (or its group) running ``workers`` pool workers; its exit status (None: hung),
    stderr, and what it left."""
    group = group_members(proc.pid)
    assert len(group) >= 1 + workers, f"not every pool worker is running: {group}"
    (os.killpg if whole_group else os.kill)(proc.pid, signum)
    try:
        _, stderr = proc.communicate(timeout=HUNG_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        return None, stderr, group_members(proc.pid)
    finally:
        remaining = left_behind(proc.pid)
        if remaining:
            os.killpg(proc.pid, signal.SIGKILL)  # this test's processes only: its own session
    return proc.returncode, stderr, remaining


def assert_stopped_cleanly(root: Path, status: int | None, stderr: str, remaining: dict[int, str], name: str, code: int) -> None:
    assert status == code, f"exit {status} (None: hung), stderr: {stderr!r}"
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fdattack: matrix stopped by {name} after "), stderr
    assert lines[0].endswith("run the same command again to continue"), stderr
    assert not remaining, f"left behind: {remaining}"
    statuses = {cell["id"]: cell["status"] for cell in json.loads((root / "matrix.json").read_text())["cells"]}
    assert set(statuses) == {"digits/fedmd/none", "digits/fedmd/laplace"} and "incomplete" in statuses.values(), statuses
    records = [json.loads(p.read_text()) for p in root.glob("*/*/*/seed_*/exit.json")]
    assert records and all((r["signal"], r["exit_code"]) == (name, code) for r in records), records  # the stop reached the runs


def test_sigterm_with_jobs_2_stops_the_running_simulations_and_a_rerun_continues_to_the_same_metrics(
    tmp_path: Path, uncut: dict[tuple[str, str], list[float]]
) -> None:
    """SIGTERM to the matrix process alone: it forwards the stop to its workers; the simulation queued behind the running
    two never starts (its folder is never made); the re-run resumes the stopped replicas from their checkpoints and
    gives the uncut matrix's per-seed values (resume is exact here: tolerance 1e-9)."""
    path, root = matrix_file(tmp_path), tmp_path / "root"
    proc = start(path, root, jobs=2)
    wait_for_a_round(proc, root)
    status, stderr, remaining = stop(proc, signal.SIGTERM, whole_group=False, workers=2)
    assert_stopped_cleanly(root, status, stderr, remaining, "SIGTERM", 143)
    assert not (root / "digits/fedmd/laplace").exists(), "a queued simulation started after the stop"
    checkpointed = {saved.parent.parent for saved in root.glob("*/*/*/seed_*/checkpoints/round_*.pt")}  # these resume
    assert checkpointed

    again = start(path, root, jobs=2)
    _, stderr = again.communicate(timeout=HUNG_S)
    assert again.returncode == 0 and not stderr, stderr
    for replica in checkpointed:
        assert "resuming" in replica.with_name(f"{replica.name}.log").read_text(), replica
    resumed = seed_values(root)
    assert resumed.keys() == uncut.keys()
    for key, values in uncut.items():
        assert resumed[key] == pytest.approx(values, rel=1e-9, abs=1e-12), key


def test_ctrl_c_to_the_process_group_stops_without_hanging_or_orphans(tmp_path: Path, uncut: dict[tuple[str, str], list[float]]) -> None:
    """SIGINT to the matrix process and its workers at once (what Ctrl-C in a terminal does): exit 130, one line, nothing
    left; the re-run gives the uncut matrix's per-seed values."""
    path, root = matrix_file(tmp_path), tmp_path / "root"
    proc = start(path, root, jobs=2)
    wait_for_a_round(proc, root)
    status, stderr, remaining = stop(proc, signal.SIGINT, whole_group=True, workers=2)
    assert_stopped_cleanly(root, status, stderr, remaining, "SIGINT", 130)
    again = start(path, root, jobs=2)
    _, stderr = again.communicate(timeout=HUNG_S)
    assert again.returncode == 0 and not stderr, stderr
    resumed = seed_values(root)
    assert resumed.keys() == uncut.keys()
    for key, values in uncut.items():
        assert resumed[key] == pytest.approx(values, rel=1e-9, abs=1e-12), key


def test_sigterm_with_jobs_1_says_it_on_stderr(tmp_path: Path) -> None:
    """One simulation at a time runs in the matrix process, its output redirected to the replica's log: the stop's line
    still reaches the real stderr."""
    root = tmp_path / "root"
    proc = start(matrix_file(tmp_path), root, jobs=1)
    wait_for_a_round(proc, root)
    status, stderr, remaining = stop(proc, signal.SIGTERM, whole_group=False, workers=0)
    assert_stopped_cleanly(root, status, stderr, remaining, "SIGTERM", 143)
