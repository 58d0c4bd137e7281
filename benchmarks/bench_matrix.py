"""The leakage matrix's shared simulation against one run per attack, and its wall time with ``--jobs 1`` and ``--jobs 2``.

A matrix cell runs one simulation that every applicable attack observes (``fdattack matrix``); before the matrix, a
user ran one ``fdattack run`` per attack, each simulating the same protocol again. For the matrix file given (default
``conf/matrix/small.yaml``) at one seed, this script times:

- ``shared, --jobs J``: ``fdattack matrix`` on a fresh root, for each J in ``--jobs`` (wall time of the command);
- ``one run per attack``: for every runnable cell and each of its attacks, ``fdattack run`` with that attack alone,
  ``--per-attack-jobs N`` runs at once with ``cores // N`` threads each, as ``--jobs N`` pins its workers (the wall
  time of them all).

and prints the totals, the ratio of the per-attack wall time to the shared one at the same parallelism, and per cell the
summed seconds of its per-attack runs.

``--levers cache`` times instead what the matrix's cache of cell-free networks saves (``cache_dir``: PLI's learned
prior, the WGAN-GP prior, the evaluation classifiers, trained once per data setting and seed): the shared matrix on a
fresh root with its cache against the same without one (``cache_dir=null``), side by side, ``--repeats`` times in
alternation, and prints the median wall time of each, their ratio, and per data setting (a cell kind) the median of the
simulations' summed seconds.
Every process inherits this shell's thread settings; run it on an otherwise idle machine and note the machine.

Usage: ``python benchmarks/bench_matrix.py [MATRIX.yaml] [--seed 0] [--jobs 1 2] [--per-attack-jobs 1] [--cells PATTERN ...]
[--levers cache] [--repeats 1]`` (``--cells`` keeps the cells whose ``data/protocol/defense`` matches one of the shell
patterns, for a quick look).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fdattack.matrix.plan import Cell, plan_cells  # noqa: E402
from fdattack.matrix.spec import load_matrix  # noqa: E402


def one_seed_matrix(path: Path, seed: int, keep: list[str], out: Path, extra: tuple[str, ...] = (), name: str = "") -> Path:
    """A copy of the matrix file at one seed whose cells outside ``keep`` (patterns) are skipped, with ``extra``
    overrides for every cell, written as ``out/<name or the file's name>``."""
    raw = yaml.safe_load(path.read_text())
    raw["seeds"] = [seed]
    raw["overrides"] = [*(raw.get("overrides") or []), *extra]
    if keep:
        spec = load_matrix(path)  # a curve's settings by name (laplace_0.5, ...), as the cells are
        names = [(d, p, f) for d in spec.data for p in spec.protocols for f in spec.defenses]
        raw["skip"] = [*raw.get("skip", []), *("/".join(n) for n in names if not any(fnmatch.fnmatchcase("/".join(n), k) for k in keep))]
    copy = out / (name or path.name)
    copy.write_text(yaml.safe_dump(raw, sort_keys=False))
    return copy


def timed(command: list[str], threads: int | None = None) -> float:
    """Wall seconds of ``command`` (with ``threads`` OpenMP/MKL threads, or this shell's); a failed command stops the
    benchmark with its last lines of output."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else None
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n" + "\n".join(done.stderr.splitlines()[-5:]))
    return time.perf_counter() - start


#: a simulation's line in ``fdattack matrix``'s output
UNIT_LINE = re.compile(r"^\[\d+/\d+\] (\S+): done \((\d+) s\)$")


def matrix_run(path: Path, root: Path, jobs: int) -> tuple[float, dict[str, float]]:
    """Wall seconds of ``fdattack matrix path --root root --jobs jobs``, and each simulation's seconds by its id."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "fdattack", "matrix", str(path), "--root", str(root), "--jobs", str(jobs)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n" + "\n".join(done.stderr.splitlines()[-5:]))
    wall = time.perf_counter() - start
    return wall, {m.group(1): float(m.group(2)) for m in map(UNIT_LINE.match, done.stdout.splitlines()) if m}


def cache_lever(path: Path, seed: int, keep: list[str], out: Path, jobs: int, repeats: int) -> None:
    """The matrix with its cache against without, ``repeats`` times in alternation on fresh roots: the table of
    :func:`main`'s ``--levers cache``."""
    arms = {
        "with the cache": one_seed_matrix(path, seed, keep, out, name="cached.yaml"),
        "without (cache_dir=null)": one_seed_matrix(path, seed, keep, out, ("cache_dir=null",), name="uncached.yaml"),
    }
    walls: dict[str, list[float]] = {arm: [] for arm in arms}
    kinds: dict[str, dict[str, list[float]]] = {arm: {} for arm in arms}
    for repeat in range(repeats):
        for arm, file in arms.items():
            wall, units = matrix_run(file, out / f"{file.stem}_{repeat}", jobs)
            walls[arm].append(wall)
            for kind in {u.split("/")[0] for u in units}:
                kinds[arm].setdefault(kind, []).append(sum(s for u, s in units.items() if u.split("/")[0] == kind))
            print(f"  {arm}, repeat {repeat + 1}: {wall:.0f} s", file=sys.stderr, flush=True)
    (cached, plain), median = arms, statistics.median
    print(f"{path.name} at seed {seed}, --jobs {jobs}, median of {repeats}: the cache of cell-free networks")
    print(f"{'':<28} {'with the cache s':>17} {'without s':>10} {'without / with':>15}")
    a, b = median(walls[cached]), median(walls[plain])
    print(f"{'wall time':<28} {a:>17.0f} {b:>10.0f} {b / a:>15.2f}")
    for kind in sorted(kinds[plain]):
        a, b = median(kinds[cached].get(kind, [float("nan")])), median(kinds[plain][kind])
        print(f"{kind + ' (summed sims)':<28} {a:>17.0f} {b:>10.0f} {b / a:>15.2f}")


def per_attack_commands(cell: Cell, seed: int, out: Path) -> list[tuple[str, list[str]]]:
    """One ``fdattack run`` per attack of ``cell`` (today's way without the matrix), named ``cell/attack``."""
    tokens = [t for t in cell.overrides if not t.startswith("attacks=")]
    experiment = [str(cell.experiment)] if cell.experiment else []
    return [
        (
            f"{cell.id}/{attack}",
            [
                sys.executable,
                "-m",
                "fdattack",
                "run",
                *experiment,
                *tokens,
                f"attacks=[{attack}]",
                f"seed={seed}",
                f"output_dir={out / cell.id / attack}",
            ],
        )
        for attack in cell.attacks
    ]


def per_attack_runs(cells: list[Cell], seed: int, out: Path, jobs: int) -> tuple[float, dict[str, float]]:
    """Wall seconds of every cell's per-attack runs, ``jobs`` at a time with ``cores // jobs`` threads each (as
    ``fdattack matrix --jobs`` pins its workers), and each run's seconds by name."""
    commands = [c for cell in cells for c in per_attack_commands(cell, seed, out)]
    threads = max(1, len(os.sched_getaffinity(0)) // jobs) if jobs > 1 else None

    def one(named: tuple[str, list[str]]) -> tuple[str, float]:
        seconds = timed(named[1], threads)
        print(f"  {named[0]}: {seconds:.0f} s", file=sys.stderr, flush=True)
        return named[0], seconds

    start = time.perf_counter()
    pool = ThreadPoolExecutor(jobs)
    try:
        runs = dict(pool.map(one, commands))
    finally:  # a failed run stops the arm: the runs not yet started are dropped
        pool.shutdown(cancel_futures=True)
    return time.perf_counter() - start, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("matrix", nargs="?", default=str(REPO / "conf" / "matrix" / "small.yaml"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, nargs="*", default=[1, 2], help="time the shared matrix at each (none: skip it)")
    parser.add_argument("--per-attack-jobs", type=int, default=1, help="per-attack runs at once (0: skip that arm)")
    parser.add_argument("--cells", nargs="*", default=[], help="shell patterns of data/protocol/defense to keep")
    parser.add_argument("--levers", choices=["cache"], help="time a lever instead: cache (with and without cache_dir)")
    parser.add_argument("--repeats", type=int, default=1, help="--levers: runs of each arm, in alternation (the median is shown)")
    args = parser.parse_args()
    if args.levers == "cache":
        with tempfile.TemporaryDirectory() as tmp:
            cache_lever(Path(args.matrix), args.seed, args.cells, Path(tmp), max(args.jobs or [1]), args.repeats)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        path = one_seed_matrix(Path(args.matrix), args.seed, args.cells, out)
        cells = [c for c in plan_cells(load_matrix(path)) if c.runs]
        shared = {}
        for jobs in args.jobs:
            shared[jobs] = timed(
                [sys.executable, "-m", "fdattack", "matrix", str(path), "--root", str(out / f"shared_{jobs}"), "--jobs", str(jobs)]
            )
            print(f"  shared --jobs {jobs}: {shared[jobs]:.0f} s", file=sys.stderr, flush=True)
        if args.per_attack_jobs:
            separate, runs = per_attack_runs(cells, args.seed, out / "per_attack", args.per_attack_jobs)
    attack_runs = sum(len(c.attacks) for c in cells)
    print(f"{Path(args.matrix).name} at seed {args.seed}: {len(cells)} simulations observed by {attack_runs} attack runs")
    print(f"{'way':<36} {'wall s':>9}")
    for jobs, seconds in shared.items():
        print(f"{f'shared, --jobs {jobs}':<36} {seconds:>9.0f}")
    if not args.per_attack_jobs:
        return
    print(f"{f'one run per attack, {args.per_attack_jobs} at a time':<36} {separate:>9.0f}")
    if args.per_attack_jobs in shared:
        print(f"one run per attack / shared, both {args.per_attack_jobs} at a time: {separate / shared[args.per_attack_jobs]:.2f}x")
    print(f"\n{'cell':<36} {'attacks':>7} {'one run per attack s (summed)':>30}")
    for cell in cells:
        print(f"{cell.id:<36} {len(cell.attacks):>7} {sum(runs[f'{cell.id}/{a}'] for a in cell.attacks):>30.0f}")


if __name__ == "__main__":
    main()
