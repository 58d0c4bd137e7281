"""``fdattack matrix MATRIX.yaml``: every attack against every protocol under every defense, with intervals.

Plans the cells (:mod:`.plan`), runs what is not done (:mod:`.run`), aggregates each cell over its seeds
(:func:`fdattack.seeds.write_aggregate`), writes ``matrix.json`` / ``matrix.csv`` (:mod:`.outputs`), the page
(:mod:`fdattack.tracking.matrix_page`) and the W&B summary run, and prints the headline tables.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from fdattack.config.composition import compose_unchecked
from fdattack.errors import ConfigError
from fdattack.matrix.comparisons import comparisons_summary
from fdattack.matrix.outputs import CellResult, summary_table, to_json, write_outputs
from fdattack.matrix.plan import Cell, cell_folder, plan_cell, plan_cells
from fdattack.matrix.run import Unit, cell_config, is_done, named_simulation, read_final, run_unit, run_units, simulation_names
from fdattack.matrix.spec import MatrixSpec, load_matrix
from fdattack.seeds import write_aggregate
from fdattack.tracking.matrix_page import HEATMAP_PREFIX, write_matrix_page
from fdattack.tracking.wandb_run import log_matrix_summary


def default_root(spec: MatrixSpec) -> Path:
    return Path("runs") / "matrix" / spec.name


def units_of(spec: MatrixSpec, cells: list[Cell]) -> list[Unit]:
    """The simulations: every runnable cell at every seed, cell-major."""
    return [Unit(cell, seed) for cell in cells if cell.runs for seed in spec.seeds]


def collect(spec: MatrixSpec, cells: list[Cell], root: Path, failures: dict[str, str]) -> list[CellResult]:
    """Each cell's outcome; a cell whose seeds all finished gets its aggregate written into its folder."""
    results = []
    for cell in cells:
        if not cell.runs:
            results.append(CellResult(cell, "n/a", cell.reason))
            continue
        units = [Unit(cell, seed) for seed in spec.seeds]
        failed = next((failures[u.id] for u in units if u.id in failures), None)
        if failed:
            results.append(CellResult(cell, "failed", failed))
        elif not all(is_done(root, u) for u in units):
            results.append(CellResult(cell, "incomplete", "seeds left to run"))
        else:
            finals = [read_final(root, u) for u in units]
            aggregate = write_aggregate(cell_config(spec, cell, root), cell_folder(root, cell), list(spec.seeds), finals)
            results.append(CellResult(cell, "done", None, list(spec.seeds), finals, aggregate))
    return results


def sweep_file(spec: MatrixSpec, units: list[Unit], root: Path) -> dict:
    """A W&B sweep (grid over the simulations) whose agents each run ``fdattack matrix FILE --cell ID``."""
    return {
        "name": spec.name,
        "method": "grid",
        "parameters": {"cell": {"values": [u.id for u in units]}},
        "command": ["fdattack", "matrix", str(spec.source.resolve()), "--root", str(root.resolve()), "${args}"],
    }


def _one_simulation(spec: MatrixSpec, root: Path, cell_arg: str) -> int:
    """``--cell``: plan that cell alone and run its seed (an n/a cell prints why and runs nothing)."""
    data, protocol, defense, seed = named_simulation(spec, cell_arg)
    cell = plan_cell(spec, data, protocol, defense)
    if not cell.runs:
        print(f"fdattack: {cell.id}/{seed}: n/a, {cell.reason}")
        return 0
    run_unit(spec, Unit(cell, seed), root)
    print(f"fdattack: {cell.id}/{seed} done in {cell_folder(root, cell)}")
    return 0


def _print_list(spec: MatrixSpec, cells: list[Cell], root: Path) -> None:
    """``--list``: every simulation of the product with its index (what ``--cell`` takes) and its state."""
    by_id = {c.id: c for c in cells}
    for index, (data, protocol, defense, seed) in enumerate(simulation_names(spec)):
        cell = by_id[f"{data}/{protocol}/{defense}"]
        state = f"n/a: {cell.reason}" if not cell.runs else "done" if is_done(root, Unit(cell, seed)) else "to run"
        print(f"{index}\t{cell.id}/{seed}\t{state}")


def main(path: Path, root: Path | None, jobs: int, cell: str | None, list_only: bool, sweep_out: Path | None) -> int:
    """The ``fdattack matrix`` command; its errors are the CLI's to report (exit status 2)."""
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: run at least one simulation at a time")
    spec = load_matrix(path)
    root = root or default_root(spec)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--root {root} exists and is not a folder; choose another")
    if cell is not None:
        return _one_simulation(spec, root, cell)
    cells = plan_cells(spec)
    units = units_of(spec, cells)
    if list_only:
        _print_list(spec, cells, root)
        return 0
    if sweep_out is not None:
        sweep_out.write_text(yaml.safe_dump(sweep_file(spec, units, root), sort_keys=False))
        print(f"fdattack: W&B sweep of {len(units)} simulations in {sweep_out}: `wandb sweep {sweep_out}`, then `wandb agent ID` anywhere")
        return 0
    failures = run_units(spec, units, root, min(jobs, max(1, len(units))))
    results = collect(spec, cells, root, failures)
    changed = write_outputs(root, spec, results)
    matrix = to_json(spec, results)
    write_matrix_page(matrix, root / "page")
    if changed:  # one W&B summary run per new state of the matrix, not one per call
        plots = sorted((root / "page" / "plots").glob(f"{HEATMAP_PREFIX}*.png"))
        log_matrix_summary(compose_unchecked(spec.experiment, list(spec.overrides)).logger.wandb, root, matrix, plots)
    print(summary_table(spec, results))
    print(comparisons_summary(matrix["comparisons"]))
    print(f"fdattack: matrix in {root.resolve()} (matrix.json, matrix.csv, page/index.html)")
    if failures:
        first_id, first = next(iter(failures.items()))
        raise ConfigError(f"{len(failures)} of {len(units)} simulations failed (logs beside their folders); first, {first_id}: {first}")
    return 0
