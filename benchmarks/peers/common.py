"""What every side-by-side driver here shares: one-thread child processes with their wall time and peak memory, the
authors' checkout copied and patched, and mean [95 % interval] cells for the tables (each metric's kind, t for differences)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fdattack.statistics.intervals import mean_interval, t_interval

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
SIDES = ("fdattack", "authors")


@dataclass(frozen=True)
class Measured:
    """One subprocess: wall seconds and peak resident set (MiB)."""

    wall_s: float
    peak_rss_mib: float


def run_child(cmd: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> Measured:
    """Run ``cmd`` on one thread (W&B off, plus ``env``), its output to ``log``; wall time and its own peak RSS
    (``os.wait4``)."""
    env = {**os.environ, **ONE_THREAD, "WANDB_MODE": "disabled", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("w") as out:
        started = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed with status {child.returncode}; see {log}")
    return Measured(wall, usage.ru_maxrss / 1024)  # ru_maxrss is in KiB on Linux


def patched_copy(checkout: Path, dest: Path, patch: Path, ignore: Callable[[str, list[str]], list[str]]) -> Path:
    """A fresh copy of the authors' ``checkout`` at ``dest`` (without what ``ignore`` names) with ``patch`` applied."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(checkout, dest, ignore=ignore)
    subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=dest, check=True)
    return dest


def checkout_commit(checkout: Path) -> str | None:
    """The checkout's commit where it is a git work tree, else None (an export)."""
    if not (checkout / ".git").exists():
        return None
    found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True)
    return found.stdout.strip() or None


def fmt(values: list[float], digits: int = 3, key: str | None = None) -> str:
    """``mean [low, high]`` over ``values`` (one per seed): the interval of metric ``key``'s kind
    (:func:`~fdattack.statistics.intervals.mean_interval`: Wilson-type for a rate, log scale for a positive quantity),
    or Student's t without a key (a paired difference, a signed quantity)."""
    low, high = t_interval(values) if key is None else mean_interval(key, values)
    return f"{np.mean(values):.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 of every array of a split (what both sides must share), keys included."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        h.update(key.encode())
        h.update(np.ascontiguousarray(arrays[key]).tobytes())
    return h.hexdigest()


def check_partition(partition_json: Path, public: np.ndarray, test: np.ndarray, private: np.ndarray, private_sizes: np.ndarray) -> None:
    """The fdattack run's ``partition.json`` holds the split file's dataset rows in the same order: ``public``,
    ``test``, and ``private`` (every client's rows one after the other, ``private_sizes`` each)."""
    run = json.loads(partition_json.read_text())
    assert np.array_equal(run["public"], public), "fdattack's public rows differ from the split file"
    assert np.array_equal(run["test"], test), "fdattack's test rows differ from the split file"
    clients = np.split(private, np.cumsum(private_sizes)[:-1])
    assert len(run["private"]) == len(clients), "fdattack's client count differs from the split file"
    for k, (theirs, ours) in enumerate(zip(run["private"], clients)):
        assert np.array_equal(theirs, ours), f"fdattack's private rows of client {k} differ from the split file"
