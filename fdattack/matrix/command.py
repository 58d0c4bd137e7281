"""``fdattack matrix MATRIX.yaml``: every attack against every protocol under every defense, with intervals.

Plans the cells (:mod:`.plan`), runs what is not done (:mod:`.run`), aggregates each cell over its seeds
(:func:`fdattack.seeds.write_aggregate`), writes ``matrix.json`` / ``matrix.csv`` (:mod:`.outputs`), the page
(:mod:`fdattack.matrix.page`) and the W&B summary run, and prints the headline tables.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from fdattack.config.composition import compose_unchecked
from fdattack.errors import ConfigError
from fdattack.matrix.answer import answers
from fdattack.matrix.cell_result import CellResult
from fdattack.matrix.comparisons import comparisons_summary
from fdattack.matrix.decide import SeedState, affordable, batch_minutes, cells_to_extend, load_state, save_state, verdict_counts
from fdattack.matrix.outputs import summary_table, to_json, write_outputs
from fdattack.matrix.page import HEATMAP_PREFIX, write_matrix_page
from fdattack.matrix.plan import Cell, cell_folder, plan_cell, plan_cells
from fdattack.matrix.run import (
    Unit,
    cell_config,
    has_finished,
    isolated,
    last_images,
    named_simulation,
    read_final,
    replica_folder,
    run_unit,
    run_units,
    simulation_names,
    stale_reason,
    stopped_in,
)
from fdattack.matrix.spec import MatrixSpec, load_matrix
from fdattack.matrix.stopping import MatrixStopped
from fdattack.matrix.wandb_summary import log_matrix_summary
from fdattack.seeds import write_aggregate
from fdattack.tracking.folder_owner import mark_matrix_root, matrix_of, run_results_in
from fdattack.tracking.stopped_attacks import listed, stopped_in_any, without_scores_of


def default_root(spec: MatrixSpec) -> Path:
    """``runs/matrix/<name>``, with ``-process`` where the attacks run isolated (their results are their own)."""
    return Path("runs") / "matrix" / f"{spec.name}{'-process' if isolated(spec) else ''}"


def with_isolation(spec: MatrixSpec, mode: str | None) -> MatrixSpec:
    """``spec`` with every simulation's attacks run in ``mode`` (``isolation.mode``; None: as the file says)."""
    return spec if mode is None else dataclasses.replace(spec, overrides=(*spec.overrides, f"isolation.mode={mode}"))


SeedsOf = Callable[[str], list[int]]


def file_seeds(spec: MatrixSpec) -> SeedsOf:
    """Every cell at the matrix file's seeds."""
    return lambda cell_id: list(spec.seeds)


def units_of(spec: MatrixSpec, cells: list[Cell], seeds_of: SeedsOf | None = None) -> list[Unit]:
    """The simulations: every runnable cell at each of its seeds (the file's, or those ``--decide`` gave it), cell-major."""
    seeds_of = seeds_of or file_seeds(spec)
    return [Unit(cell, seed) for cell in cells if cell.runs for seed in seeds_of(cell.id)]


def collect(spec: MatrixSpec, cells: list[Cell], root: Path, failures: dict[str, str], seeds_of: SeedsOf | None = None) -> list[CellResult]:
    """Each cell's outcome; a cell whose seeds all finished gets its aggregate written into its folder."""
    seeds_of = seeds_of or file_seeds(spec)
    results = []
    for cell in cells:
        if not cell.runs:
            results.append(CellResult(cell, "n/a", cell.reason))
            continue
        seeds = seeds_of(cell.id)
        units = [Unit(cell, seed) for seed in seeds]
        failed = next((failures[u.id] for u in units if u.id in failures), None)
        if failed:
            results.append(CellResult(cell, "failed", failed))
        elif not all(has_finished(root, u) for u in units):
            results.append(CellResult(cell, "incomplete", "seeds left to run"))
        else:
            cfg = cell_config(spec, cell, root)
            finals = [read_final(cfg, root, u, spec.name) for u in units]
            aggregate = write_aggregate(cfg, cell_folder(root, cell), seeds, finals)
            stopped = stopped_in_any(finals)  # no score at any seed (the aggregate's too), and run again next time
            finals = [without_scores_of(final, stopped) for final in finals]
            images = last_images(root, units, tuple(a for a in cell.attacks if a not in stopped))
            results.append(CellResult(cell, "done", None, seeds, finals, aggregate, images, stopped))
    return results


def sweep_file(spec: MatrixSpec, units: list[Unit], root: Path) -> dict:
    """A W&B sweep (grid over the simulations) whose agents each run ``fdattack matrix FILE --cell ID``."""
    return {
        "name": spec.name,
        "method": "grid",
        "parameters": {"cell": {"values": [u.id for u in units]}},
        "command": ["fdattack", "matrix", str(spec.source.resolve()), "--root", str(root.resolve()), *_isolation_args(spec), "${args}"],
    }


def _isolation_args(spec: MatrixSpec) -> list[str]:
    """``--isolation process`` where the matrix runs isolated (the agents run as the matrix would)."""
    return ["--isolation", "process"] if isolated(spec) else []


def _one_simulation(spec: MatrixSpec, root: Path, cell_arg: str) -> int:
    """``--cell``: plan that cell alone and run its seed (an n/a cell prints why and runs nothing)."""
    data, protocol, defense, seed = named_simulation(spec, cell_arg)
    cell = plan_cell(spec, data, protocol, defense)
    if not cell.runs:
        print(f"fdattack: {cell.id}/{seed}: n/a, {cell.reason}")
        return 0
    claim_root(root, spec.name)
    run_unit(spec, Unit(cell, seed), root)
    print(f"fdattack: {cell.id}/{seed} done in {cell_folder(root, cell)}")
    return 0


def unit_states(spec: MatrixSpec, cells: list[Cell], root: Path, seeds_of: SeedsOf | None = None) -> dict[str, str]:
    """Each simulation's state by id: ``done``, ``to run`` (nothing yet, or cut short: it resumes) or ``stale: <why>``
    (its folder holds a run of other settings than the matrix file now gives). A cell's config is composed only where
    one of its folders holds something."""
    seeds_of = seeds_of or file_seeds(spec)
    states = {}
    for cell in cells:
        units = [Unit(cell, seed) for seed in seeds_of(cell.id)] if cell.runs else []
        cfg = cell_config(spec, cell, root) if any(replica_folder(root, u).exists() for u in units) else None
        for unit in units:
            reason = stale_reason(cfg, root, unit, spec.name) if cfg is not None else None
            states[unit.id] = f"stale: {reason}" if reason else _state(root, unit)
    return states


def _state(root: Path, unit: Unit) -> str:
    """``done``, ``to run``, or ``to run again`` where the simulation finished with an attack stopped."""
    if not has_finished(root, unit):
        return "to run"
    stopped = stopped_in(root, unit)
    return f"to run again: it stopped {listed(stopped)}" if stopped else "done"


def check_none_stale(spec: MatrixSpec, units: list[Unit], states: dict[str, str], root: Path) -> None:
    """Refuse, before anything runs, a root whose simulations were made with other settings: their results would be
    taken as this matrix's (or, cut short, continued under other settings).

    Raises:
        ConfigError: naming how many, the first and what differs in it.
    """
    stale = [u for u in units if states[u.id].startswith("stale")]
    if stale:
        first = stale[0]
        raise ConfigError(
            f"{len(stale)} of {len(units)} simulations in {root} were made with other settings than {spec.source} gives now "
            f"(first, {first.id}: {states[first.id].removeprefix('stale: ')}); run the matrix with the settings they were made "
            "with, choose another --root, or delete their folders to run them again"
        )


def _print_list(spec: MatrixSpec, cells: list[Cell], root: Path, only: str | None, seeds_of: SeedsOf) -> None:
    """``--list``: every simulation of the product (or the one ``--cell`` names) with its index (what ``--cell`` takes)
    and its state; then the seeds ``--decide`` added, marked ``+`` (no index: they are not of the file's product)."""
    by_id = {c.id: c for c in cells}
    states = unit_states(spec, cells, root, seeds_of)
    chosen = named_simulation(spec, only) if only is not None else None
    for index, (data, protocol, defense, seed) in enumerate(simulation_names(spec)):
        if chosen is not None and chosen != (data, protocol, defense, seed):
            continue
        cell = by_id[f"{data}/{protocol}/{defense}"]
        state = f"n/a: {cell.reason}" if not cell.runs else states[Unit(cell, seed).id]
        print(f"{index}\t{cell.id}/{seed}\t{state}")
    for cell in cells if chosen is None else []:
        for seed in (s for s in seeds_of(cell.id) if cell.runs and s not in spec.seeds):
            print(f"+\t{cell.id}/{seed}\t{states[Unit(cell, seed).id]}")


def _check_writable(root: Path) -> None:
    """The matrix writes under ``root``: it must be a folder this process can write to, or one it can create (the
    nearest existing folder above it writable). Nothing is created here.

    Raises:
        ConfigError: naming ``--root`` and why not.
    """
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--root {root} exists and is not a folder; choose another")
    existing = next(folder for folder in (root, *root.absolute().parents) if folder.exists())
    if not existing.is_dir():
        raise ConfigError(f"--root {root} cannot be created: {existing} is a file; choose another")
    if root.exists():
        try:
            tempfile.TemporaryFile(dir=root).close()
        except OSError as err:
            raise ConfigError(f"--root {root} cannot be written to ({err.strerror or err}); choose another") from None
    elif not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--root {root} cannot be created: {existing} is not writable; choose another")


def check_root(root: Path, name: str) -> None:
    """Refuse ``root`` where it is another matrix's root or holds a run or a seeds aggregate, whose files the matrix's
    would overwrite or lie beside (:mod:`~fdattack.tracking.folder_owner`); reads only.

    Raises:
        ConfigError: naming ``--root`` and what it holds.
    """
    owner = matrix_of(root)
    if owner is not None and owner != name:
        raise ConfigError(f"--root {root} is the root of the matrix {owner!r}, not of {name!r}; choose another --root")
    held = run_results_in(root) if owner is None else None
    if held is not None:
        raise ConfigError(f"--root {root} holds {held}, which the matrix's files would overwrite or lie beside; choose another --root")


def claim_root(root: Path, name: str) -> None:
    """Mark ``root`` as matrix ``name``'s, once its cells are planned and before anything runs there.

    Raises:
        ConfigError: it cannot be written to.
    """
    try:
        mark_matrix_root(root, name)
    except OSError as err:
        raise ConfigError(f"--root {root} cannot be written to ({err.strerror or err}); choose another") from None


def _write_sweep_file(path: Path, sweep: dict) -> None:
    try:
        path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    except OSError as err:
        raise ConfigError(f"--sweep-file {path} cannot be written ({err.strerror or err}); choose another path") from None


def main(
    path: Path,
    root: Path | None,
    jobs: int,
    cell: str | None,
    list_only: bool,
    sweep_out: Path | None,
    decide: bool = False,
    isolation: str | None = None,
) -> int:
    """The ``fdattack matrix`` command; its errors are the CLI's to report (exit status 2)."""
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: run at least one simulation at a time")
    spec = with_isolation(load_matrix(path), isolation)
    root = root or default_root(spec)
    state = load_state(root, spec.design())
    seeds_of = state.seeds_of if state is not None else file_seeds(spec)
    if list_only:  # runs nothing, writes nothing
        cells = plan_cells(spec)
        _print_list(spec, cells, root, cell, seeds_of)
        return 0
    if sweep_out is not None:  # the agents write under root, wherever they run
        units = units_of(spec, plan_cells(spec))
        _write_sweep_file(sweep_out, sweep_file(spec, units, root))
        print(f"fdattack: W&B sweep of {len(units)} simulations in {sweep_out}: `wandb sweep {sweep_out}`, then `wandb agent ID` anywhere")
        return 0
    _check_writable(root)
    check_root(root, spec.name)
    if cell is not None:
        return _one_simulation(spec, root, cell)
    cells = plan_cells(spec)
    if decide and state is None:
        state = SeedState(spec.design())
        seeds_of = state.seeds_of  # reads the state as each look extends it
    started, stopped, failures = time.monotonic(), None, {}
    spent_before = state.minutes if state is not None else 0.0
    while True:
        units = units_of(spec, cells, seeds_of)
        check_none_stale(spec, units, unit_states(spec, cells, root, seeds_of), root)
        claim_root(root, spec.name)
        try:
            failures = run_units(spec, units, root, min(jobs, max(1, len(units))))
        except MatrixStopped as stop:  # what finished is written; then the stop ends the command (exit status 143 / 130)
            failures, stopped = stop.failures, stop
        results = collect(spec, cells, root, failures, seeds_of)
        if not decide or stopped is not None or failures or state is None:
            break
        if not _next_look(spec, state, results, root, spent_before + (time.monotonic() - started) / 60, jobs):
            break
    if decide and state is not None and stopped is not None:  # a resumed run spends what is left of the one budget
        state.minutes = spent_before + (time.monotonic() - started) / 60
        save_state(root, state)
    changed = write_outputs(root, spec, results, state)
    matrix = to_json(spec, results, state)
    write_matrix_page(matrix, root / "page", images_from=root)
    if stopped is not None:
        raise stopped
    if changed:  # one W&B summary run per new state of the matrix, not one per call
        plots = sorted((root / "page" / "plots").glob(f"{HEATMAP_PREFIX}*.png"))
        log_matrix_summary(compose_unchecked(spec.experiment, list(spec.overrides)).logger.wandb, root, matrix, plots)
    print(summary_table(spec, results))
    print(comparisons_summary(matrix["comparisons"]))
    if state is not None and state.looks:
        design = spec.design()
        looks = f"{len(state.looks)} look(s) of {design.looks}"
        print(f"fdattack: --decide: {state.looks[-1]['why']} after {looks} (each at α = {design.alpha:.3g})")
    print(f"fdattack: matrix in {root.resolve()} (matrix.json, matrix.csv, page/index.html)")
    if failures:
        first_id, first = next(iter(failures.items()))
        raise ConfigError(f"{len(failures)} of {len(units)} simulations failed (logs beside their folders); first, {first_id}: {first}")
    return 0


def _why(cell_id: str, waiting: set[str], room: list[str], stop: str, seeds: int, max_seeds: int) -> str:
    """Why a cell holds its seeds after a look (``stop``: why no batch follows, empty where one does)."""
    if cell_id not in waiting:
        return f"decided at {seeds} seeds"
    if seeds >= max_seeds:
        return f"undecided at max_seeds={max_seeds}"
    if cell_id not in room:
        return f"undecided at {seeds} seeds: {stop or 'its batch would end past the budget'}"
    return f"undecided at {seeds} seeds: {stop}" if stop else f"undecided at {seeds} seeds: gets more"


def _next_look(spec: MatrixSpec, state: SeedState, results: list[CellResult], root: Path, minutes: float, jobs: int) -> bool:
    """Record this look's verdicts in ``state`` and give the next batch of seeds to the undecided cells whose batch ends
    within the budget (``minutes``: spent so far); whether there is a batch to run (False: every cell decided, each
    undecided one at ``max_seeds``, or no batch fits in what is left of the budget)."""
    design = spec.design()
    matrix = to_json(spec, results, state)
    rows = answers(matrix)
    waiting = cells_to_extend(rows, matrix["undefended"], {r.cell.id for r in results if r.status == "done"})
    costs = {r.cell.id: batch_minutes(r.per_seed, design.batch) for r in results if r.cell.id in waiting}
    room = affordable({c: costs[c] for c in waiting if len(state.seeds_of(c)) < design.max_seeds}, design.budget_minutes - minutes, jobs)
    state.minutes = minutes
    if not waiting:
        why = "every cell decided"
    elif not any(len(state.seeds_of(c)) < design.max_seeds for c in waiting):
        why = f"the undecided cells have max_seeds={design.max_seeds}"
    elif not room:
        why = f"no batch ends within the budget of {design.budget_minutes:g} minutes ({minutes:.0f} spent)"
    else:
        why = ""
    look = {"look": len(state.looks) + 1, "minutes": round(minutes, 2), "verdicts": verdict_counts(rows), "waiting": sorted(waiting)}
    added = sorted({len(design.next_seeds(state.seeds_of(c))) - len(state.seeds_of(c)) for c in room}) or [0]
    more = str(added[0]) if added[0] == added[-1] else f"{added[0]}-{added[-1]}"  # the last look may reach max_seeds with fewer
    state.looks.append({**look, "why": why or f"{len(room)} cell(s) get {more} more seed(s)"})
    for r in results:  # why each cell holds the seeds it holds
        if r.status == "done":
            entry = state.cells.setdefault(r.cell.id, {"seeds": list(r.seeds)})
            entry["why"] = _why(r.cell.id, waiting, room, why, len(r.seeds), design.max_seeds)
    for cell_id in room if not why else []:
        state.cells[cell_id]["seeds"] = design.next_seeds(state.seeds_of(cell_id))
    save_state(root, state)
    return not why
