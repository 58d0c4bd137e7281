"""Running the matrix's simulations: one per (cell, seed), here one after the other, in a pool of ``--jobs N`` worker
processes (each with its share of the cores, importing torch once for all the simulations it takes), or one named by
``--cell`` (what a W&B agent or a SLURM array task runs).

A (cell, seed) is an ordinary replica of ``fdattack run ... seeds=[...]`` (:func:`fdattack.seeds.run_replica`) in
``<root>/<data>/<protocol>/<defense>/seed_<s>/``: one that finished before for the same config is read, not run again,
one cut short resumes from its last checkpoint. Its output goes to ``seed_<s>.log`` beside its folder; what the matrix
prints is one line per simulation as it ends: the time, its outcome, its seconds and what is left at the pace so far.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from fdattack.config.composition import compose
from fdattack.errors import CheckpointError, ConfigError, FdattackError, Terminated
from fdattack.matrix.plan import Cell, cell_folder
from fdattack.matrix.spec import CACHE_FOLDER, MatrixSpec
from fdattack.matrix.stopping import MatrixStopped, WorkerStopped, start_worker, stop_workers, stoppable, stops_raise, workers_born_blocked
from fdattack.seeds import REPLICA_PREFIX, replica_config, run_replica
from fdattack.tracking.logs import configure_logging
from fdattack.tracking.results import difference_from, read_result, stored_config
from fdattack.tracking.stopped_attacks import listed, stopped_attacks

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
    """The config of a cell's seeds (``seeds`` set): its folder, the matrix's W&B group, the cell as W&B name, and the
    matrix's cache of networks that depend on no cell (``<root>/cache``, unless the file sets ``cache_dir``)."""
    return compose(
        cell.experiment,
        [
            f"cache_dir={root / CACHE_FOLDER}",
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


#: the kinds of image a run saves of an attack's results that a reader can check a score against
IMAGE_KINDS = ("reconstructions", "inversions")


def last_images(root: Path, units: list[Unit], attacks: tuple[str, ...]) -> dict[str, list[str]]:
    """Per attack that saved any, the last round's image of its reconstructions or inversions at each seed that has
    one (paths relative to ``root``, in the units' order)."""
    found: dict[str, list[str]] = {}
    for attack in attacks:
        paths = []
        for unit in units:
            folder = replica_folder(root, unit) / "images"
            saved = sorted(p for kind in IMAGE_KINDS for p in folder.glob(f"attack_{attack}_{kind}_round_*.png"))
            if saved:
                paths.append(saved[-1].relative_to(root).as_posix())
        if paths:
            found[attack] = paths
    return found


def has_finished(root: Path, unit: Unit) -> bool:
    """Whether the simulation ran to its end (its ``metrics.json`` exists); that it was made with this config is checked
    before anything runs (:func:`stale_reason`) and again when it is read (:func:`read_final`)."""
    return (replica_folder(root, unit) / "metrics.json").is_file()


def stopped_in(root: Path, unit: Unit) -> dict[str, str]:
    """The attacks that the finished simulation stopped (:func:`~fdattack.tracking.stopped_attacks.stopped_attacks`);
    {} where none did, or its ``metrics.json`` cannot be read (:func:`read_final` says so)."""
    try:
        metrics = json.loads((replica_folder(root, unit) / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}
    return stopped_attacks(metrics) if isinstance(metrics, dict) else {}


def is_done(root: Path, unit: Unit) -> bool:
    """Whether the simulation finished with every attack's answer: one that stopped an attack runs again."""
    return has_finished(root, unit) and not stopped_in(root, unit)


def set_aside(folder: Path) -> Path:
    """Move a simulation's folder to ``<folder>.stopped-<n>`` beside it (the first free n), so that it runs anew and
    nothing of the earlier run is lost; its new place."""
    for n in itertools.count(1):
        aside = folder.with_name(f"{folder.name}.stopped-{n}")
        if not aside.exists():
            folder.rename(aside)
            return aside
    raise AssertionError("unreachable")


def unit_config(cell_cfg: DictConfig, root: Path, unit: Unit, group: str) -> DictConfig:
    """The replica config of ``unit`` (its cell's config ``cell_cfg`` at the unit's seed): what its folder was made with."""
    return replica_config(cell_cfg, unit.seed, replica_folder(root, unit), group, resume=True)


def stale_reason(cell_cfg: DictConfig, root: Path, unit: Unit, group: str) -> str | None:
    """Why the simulation's folder holds a run of other settings than the matrix now gives (the first differing key, or
    no ``config.yaml`` to show them); None when it holds nothing yet or this config's run, finished or cut short."""
    folder = replica_folder(root, unit)
    if not any((folder / name).is_file() for name in ("metrics.json", "config.yaml")):
        return None
    try:
        return difference_from(stored_config(folder), unit_config(cell_cfg, root, unit, group))
    except CheckpointError as err:
        return str(err)


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
                stopped = stopped_in(root, unit) if has_finished(root, unit) else {}
                if stopped:
                    aside = set_aside(replica_folder(root, unit))
                    log.warning("%s stopped %s: run again (the earlier run is in %s)", unit.id, listed(stopped), aside)
                return run_replica(cfg, unit.seed, folder, spec.name, run)
        finally:
            configure_logging("INFO")  # the run gave fdattack's logger the log file; the matrix logs to stderr again


def _start_worker(threads: int, parent: int) -> None:
    """A pool worker's set-up: its death with the matrix process ``parent`` and its stop handler
    (:func:`.stopping.start_worker`), then its torch threads."""
    start_worker(parent)
    _pin_threads(threads)


def _pin_threads(threads: int) -> None:
    """``threads`` torch (OpenMP, MKL) threads for every simulation this process runs."""
    import torch

    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def _run_or_say(spec: MatrixSpec, unit: Unit, root: Path) -> str | None:
    """Run ``unit`` in this process; its one-line error, or None."""
    try:
        run_unit(spec, unit, root)
    except FdattackError as err:
        return str(err)
    return None


def _say(index: int, total: int, unit: Unit, root: Path, error: str | None, seconds: float, started: float) -> None:
    """One line as a simulation ends: its outcome, its seconds, and when the rest should be done at the pace so far."""
    stopped = {} if error else stopped_in(root, unit)
    outcome = f"failed: {error}" if error else f"stopped {listed(stopped)}, which run again next time" if stopped else "done"
    when = time.strftime("%H:%M:%S")
    print(f"[{when}] [{index}/{total}] {unit.id}: {outcome} ({seconds:.0f} s{_eta(index, total, started)})", flush=True)


def _eta(index: int, total: int, started: float) -> str:
    """``; N left, about M min`` from the mean wall time per finished simulation since ``started`` (monotonic)."""
    left = total - index
    if left <= 0:
        return ""
    minutes = (time.monotonic() - started) / index * left / 60
    return f"; {left} left, about {minutes:.0f} min" if minutes >= 1 else f"; {left} left, under a minute"


def _timed_run(spec: MatrixSpec, unit: Unit, root: Path) -> tuple[str | None, float]:
    """A pool worker's job: run ``unit``; its one-line error (or None) and its seconds."""
    start = time.perf_counter()
    error = _run_or_say(spec, unit, root)
    return error, time.perf_counter() - start


def run_units(spec: MatrixSpec, units: list[Unit], root: Path, jobs: int) -> dict[str, str]:
    """Run every unit not done yet, ``jobs`` at a time (1: in this process), printing a line as each ends.

    With ``jobs`` > 1 the units go to a pool of ``jobs`` spawned worker processes with ``cores // jobs`` threads each
    (an :func:`isolated` matrix's, at any ``jobs``, each in a process of its own); a worker that dies (killed, out of
    memory) fails its unit and the units still queued in its pool (an isolated simulation's pool holds it alone), with
    that reason. A SIGTERM or SIGINT ends the running units at their next safe point and starts no other
    (:mod:`.stopping`).

    Returns:
        unit id -> its one-line error, for those that failed (the others ran or were done before).

    Raises:
        MatrixStopped: a signal stopped the units (every worker has exited), with the failures before it.
    """
    todo = [u for u in units if not is_done(root, u)]
    print(f"fdattack: matrix {spec.name}: {len(units)} simulations, {len(units) - len(todo)} done before, {len(todo)} to run")
    failures: dict[str, str] = {}
    try:
        with stops_raise():
            if jobs == 1 and not isolated(spec):
                _run_here(spec, todo, root, failures)
            else:
                _run_in_pool(spec, todo, root, jobs, failures)
    except Terminated as stop:
        raise MatrixStopped(stop, sum(is_done(root, u) for u in units), len(units), failures) from None
    return failures


def isolated(spec: MatrixSpec) -> bool:
    """Whether the matrix runs its attacks isolated (``isolation.mode=process`` among its overrides: ``--isolation
    process``). Each of its simulations then runs in a fresh process, which composes its config (and reads its attacks'
    declarations for the checks) before any data is there: no attack code runs in a process that held a split."""
    return any(o.replace(" ", "") == "isolation.mode=process" for o in spec.overrides)


def _run_here(spec: MatrixSpec, todo: list[Unit], root: Path, failures: dict[str, str]) -> None:
    """Run ``todo`` one after the other in this process, each failure into ``failures``."""
    started = time.monotonic()
    for index, unit in enumerate(todo, 1):
        error, seconds = _timed_run(spec, unit, root)
        if error:
            failures[unit.id] = error
        _say(index, len(todo), unit, root, error, seconds, started)


def _run_in_pool(spec: MatrixSpec, todo: list[Unit], root: Path, jobs: int, failures: dict[str, str]) -> None:
    """Run ``todo`` in ``jobs`` worker processes, each failure into ``failures``; a stop is forwarded to the workers,
    and raised again once they have exited. An :func:`isolated` matrix's simulations each get a one-worker pool of
    their own, at most ``jobs`` at once (a shared pool given ``max_tasks_per_child=1`` starts a replacement for every
    worker that ends, the last ones too: an interpreter importing torch for nothing, which its shutdown waits for; and
    Python 3.10 has no such argument)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    context = multiprocessing.get_context("spawn")  # not fork: torch's threads and the parent's state stay out
    threads = max(1, cores // jobs)

    def pool_of(workers: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(threads, os.getpid()))

    pools: list[ProcessPoolExecutor] = []
    submitted: dict[Future, tuple[Unit, ProcessPoolExecutor]] = {}
    waiting = list(todo)

    def submit(pool: ProcessPoolExecutor, unit: Unit) -> None:
        with workers_born_blocked():
            submitted[pool.submit(stoppable, _timed_run, spec, unit, root)] = (unit, pool)

    started, ended = time.monotonic(), 0
    try:
        if isolated(spec):
            while waiting and len(submitted) < jobs:
                pools.append(pool_of(1))
                submit(pools[-1], waiting.pop(0))
        else:
            pools.append(pool_of(jobs))
            while waiting:
                submit(pools[0], waiting.pop(0))
        while submitted:
            done, _ = wait(submitted, return_when=FIRST_COMPLETED)
            for future in done:
                unit, pool = submitted.pop(future)
                ended += 1
                error, seconds = _outcome(future)
                if error:
                    failures[unit.id] = error
                _say(ended, len(todo), unit, root, error, seconds, started)
                if isolated(spec):
                    pool.shutdown(wait=True)
                    pools.remove(pool)
                    if waiting:
                        pools.append(pool_of(1))
                        submit(pools[-1], waiting.pop(0))
    except Terminated as stop:
        stop_workers(pools, stop)
        raise
    finally:
        for pool in pools:
            pool.shutdown(wait=True)


def _outcome(future: Future) -> tuple[str | None, float]:
    """A finished simulation's one-line error (None: it ran) and its seconds."""
    try:
        return future.result()
    except WorkerStopped as stopped:  # a signal to that worker alone
        return str(stopped), 0.0
    except BrokenProcessPool:
        return "its worker process died (killed or out of memory); run the matrix again to retry it", 0.0


def read_final(cell_cfg: DictConfig, root: Path, unit: Unit, group: str) -> dict[str, float]:
    """The final metrics of a finished simulation, made with its config (:func:`~fdattack.tracking.results.read_result`).

    Raises:
        FdattackError: one line naming the folder and what is wrong with it.
    """
    folder = replica_folder(root, unit)
    try:
        return read_result(folder, unit_config(cell_cfg, root, unit, group))
    except FdattackError as err:
        raise type(err)(f"{unit.id}: {err}; delete {folder} to run it again") from None


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
    if cell_arg.isascii() and cell_arg.isdigit():  # not '²', which isdigit() also takes
        if int(cell_arg) < len(names):
            return names[int(cell_arg)]
        raise ConfigError(f"--cell {cell_arg}: this matrix has {len(names)} simulations, 0 to {len(names) - 1}")
    parts = cell_arg.split("/")
    for names_of in names:
        if len(parts) == 4 and parts[:3] == list(names_of[:3]) and parts[3] == str(names_of[3]):
            return names_of
    raise ConfigError(f"--cell {cell_arg}: no such simulation in this matrix; `--list` prints them (data/protocol/defense/seed)")
