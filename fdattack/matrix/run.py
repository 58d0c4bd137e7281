"""Running the matrix's simulations: one per (cell, seed), here one after the other, in ``--jobs N`` processes at once,
or one named by ``--cell`` (what a W&B agent or a SLURM array task runs).

A (cell, seed) is an ordinary replica of ``fdattack run ... seeds=[...]`` (:func:`fdattack.seeds.run_replica`) in
``<root>/<data>/<protocol>/<defense>/seed_<s>/``: one that finished before for the same config is read, not run again,
one cut short resumes from its last checkpoint. Its output goes to ``seed_<s>.log`` beside its folder; what the matrix
prints is one line per simulation.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from fdattack.config.composition import compose
from fdattack.errors import ConfigError, FdattackError
from fdattack.matrix.plan import Cell, cell_folder
from fdattack.matrix.spec import MatrixSpec
from fdattack.seeds import REPLICA_PREFIX, run_replica
from fdattack.tracking.logs import configure_logging

log = logging.getLogger("fdattack")

#: a W&B run of one (cell, seed) has this job type; the matrix's summary run ``matrix-summary``
CELL_JOB_TYPE = "matrix-cell"


@dataclass(frozen=True)
class Unit:
    """One simulation: a cell at one seed."""

    cell: Cell
    seed: int

    @property
    def id(self) -> str:
        """``data/protocol/defense/seed``, the value ``--cell`` takes."""
        return f"{self.cell.id}/{self.seed}"


def cell_config(spec: MatrixSpec, cell: Cell, root: Path) -> DictConfig:
    """The config of a cell's seeds (``seeds`` set): its folder, the matrix's W&B group, the cell as W&B name."""
    return compose(
        cell.experiment,
        [
            *cell.overrides,
            f"seeds=[{','.join(map(str, spec.seeds))}]",
            f"output_dir={cell_folder(root, cell)}",
            f"logger.wandb.group={spec.name}",
            f"logger.wandb.name={cell.id}",
            f"logger.wandb.job_type={CELL_JOB_TYPE}",
        ],
    )


def replica_folder(root: Path, unit: Unit) -> Path:
    return cell_folder(root, unit.cell) / f"{REPLICA_PREFIX}{unit.seed}"


def is_done(root: Path, unit: Unit) -> bool:
    """Whether the simulation finished (its ``metrics.json`` exists; that it is this config's is checked when read)."""
    return (replica_folder(root, unit) / "metrics.json").is_file()


def run_unit(spec: MatrixSpec, unit: Unit, root: Path) -> dict[str, float]:
    """Run (or read, or resume) one simulation in this process, its output into its log file."""
    from fdattack.experiment import run

    cfg = cell_config(spec, unit.cell, root)
    folder = cell_folder(root, unit.cell)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{REPLICA_PREFIX}{unit.seed}.log", "a", encoding="utf-8") as out:
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                configure_logging(str(cfg.logger.level))  # the replica's lines too, before its run configures its own
                return run_replica(cfg, unit.seed, folder, spec.name, run)
        finally:
            configure_logging("INFO")  # the run gave fdattack's logger the log file; the matrix logs to stderr again


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _in_subprocess(spec: MatrixSpec, unit: Unit, root: Path, threads: int) -> str | None:
    """Run ``unit`` as ``fdattack matrix FILE --cell ID`` with ``threads`` threads; its one-line error, or None."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "fdattack", "matrix", str(spec.source), "--root", str(root), "--cell", unit.id]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode == 0:
        return None
    return _last_line(proc.stderr).removeprefix("fdattack: error: ") + f" (exit status {proc.returncode})"


def _in_process(spec: MatrixSpec, unit: Unit, root: Path) -> str | None:
    try:
        run_unit(spec, unit, root)
    except FdattackError as err:
        return str(err)
    return None


def run_units(spec: MatrixSpec, units: list[Unit], root: Path, jobs: int) -> dict[str, str]:
    """Run every unit not done yet, ``jobs`` at a time (1: in this process), printing a line as each ends.

    Returns:
        unit id -> its one-line error, for those that failed (the others ran or were done before).
    """
    todo = [u for u in units if not is_done(root, u)]
    print(f"fdattack: matrix {spec.name}: {len(units)} simulations, {len(units) - len(todo)} done before, {len(todo)} to run")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // jobs)
    failures: dict[str, str] = {}

    def one(index: int, unit: Unit) -> None:
        start = time.perf_counter()
        error = _in_process(spec, unit, root) if jobs == 1 else _in_subprocess(spec, unit, root, threads)
        took = time.perf_counter() - start
        if error:
            failures[unit.id] = error
        print(f"[{index}/{len(todo)}] {unit.id}: {'failed: ' + error if error else 'done'} ({took:.0f} s)", flush=True)

    if jobs == 1:
        for i, unit in enumerate(todo, 1):
            one(i, unit)
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(lambda pair: one(*pair), enumerate(todo, 1)))
    return failures


def read_final(root: Path, unit: Unit) -> dict[str, float]:
    """The final metrics of a finished simulation."""
    path = replica_folder(root, unit) / "metrics.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read ({err}); delete the folder to run it again") from None


def simulation_names(spec: MatrixSpec) -> list[tuple[str, str, str, int]]:
    """Every (data, protocol, defense, seed) of the matrix's product, n/a cells included, in ``--list`` order: an index
    names the same simulation on every machine without planning the cells (SLURM array tasks)."""
    return list(itertools.product(spec.data, spec.protocols, spec.defenses, spec.seeds))


def named_simulation(spec: MatrixSpec, cell_arg: str) -> tuple[str, str, str, int]:
    """The simulation ``--cell`` names: ``data/protocol/defense/seed`` or its index in ``--list``.

    Raises:
        ConfigError: no such simulation in this matrix.
    """
    names = simulation_names(spec)
    if cell_arg.isdigit():
        if int(cell_arg) < len(names):
            return names[int(cell_arg)]
        raise ConfigError(f"--cell {cell_arg}: this matrix has {len(names)} simulations, 0 to {len(names) - 1}")
    parts = cell_arg.split("/")
    for names_of in names:
        if len(parts) == 4 and parts[:3] == list(names_of[:3]) and parts[3] == str(names_of[3]):
            return names_of
    raise ConfigError(f"--cell {cell_arg}: no such simulation in this matrix; `--list` prints them (data/protocol/defense/seed)")
