"""The leakage matrix's shared simulation against one run per attack, and its wall time with ``--jobs 1`` and ``--jobs 2``.

A matrix cell runs one simulation that every applicable attack observes (``fdattack matrix``); before the matrix, a
user ran one ``fdattack run`` per attack, each simulating the same protocol again. For the matrix file given (default
``conf/matrix/small.yaml``) at one seed, this script times:

- ``shared, --jobs J``: ``fdattack matrix`` on a fresh root, for each J in ``--jobs`` (wall time of the command);
- ``one run per attack``: for every runnable cell and each of its attacks, ``fdattack run`` with that attack alone
  (the sum of the runs' wall times; each run one process with the cores to itself, as ``--jobs 1`` runs them).

and prints the totals, the ratio of the per-attack total to the shared ``--jobs 1`` total, and per cell the two times.
Every process inherits this shell's thread settings; run it on an otherwise idle machine and note the machine.

Usage: ``python benchmarks/bench_matrix.py [MATRIX.yaml] [--seed 0] [--jobs 1 2] [--cells PATTERN ...]``
(``--cells`` keeps the cells whose ``data/protocol/defense`` matches one of the shell patterns, for a quick look).
"""

from __future__ import annotations

import argparse
import fnmatch
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fdattack.matrix.plan import Cell, plan_cells  # noqa: E402
from fdattack.matrix.spec import load_matrix  # noqa: E402


def one_seed_matrix(path: Path, seed: int, keep: list[str], out: Path) -> Path:
    """A copy of the matrix file at one seed whose cells outside ``keep`` (patterns) are skipped."""
    raw = yaml.safe_load(path.read_text())
    raw["seeds"] = [seed]
    if keep:
        names = [(d, p, f) for d in raw["data"] for p in raw["protocols"] for f in raw["defenses"]]
        raw["skip"] = [*raw.get("skip", []), *("/".join(n) for n in names if not any(fnmatch.fnmatchcase("/".join(n), k) for k in keep))]
    copy = out / path.name
    copy.write_text(yaml.safe_dump(raw, sort_keys=False))
    return copy


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    return time.perf_counter() - start


def per_attack_runs(cell: Cell, seed: int, out: Path) -> float:
    """Seconds of one ``fdattack run`` per attack of ``cell`` (today's way without the matrix)."""
    total = 0.0
    for attack in cell.attacks:
        tokens = [t for t in cell.overrides if not t.startswith("attacks=")]
        experiment = [str(cell.experiment)] if cell.experiment else []
        folder = out / cell.id / attack
        total += timed(
            [sys.executable, "-m", "fdattack", "run", *experiment, *tokens, f"attacks=[{attack}]", f"seed={seed}", f"output_dir={folder}"]
        )
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("matrix", nargs="?", default=str(REPO / "conf" / "matrix" / "small.yaml"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cells", nargs="*", default=[], help="shell patterns of data/protocol/defense to keep")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        path = one_seed_matrix(Path(args.matrix), args.seed, args.cells, out)
        cells = [c for c in plan_cells(load_matrix(path)) if c.runs]
        shared = {
            jobs: timed([sys.executable, "-m", "fdattack", "matrix", str(path), "--root", str(out / f"shared_{jobs}"), "--jobs", str(jobs)])
            for jobs in args.jobs
        }
        separate = {cell.id: per_attack_runs(cell, args.seed, out / "per_attack") for cell in cells}
    attacks = sum(len(c.attacks) for c in cells)
    print(f"{Path(args.matrix).name} at seed {args.seed}: {len(cells)} simulations observed by {attacks} attack runs in all")
    print(f"{'way':<28} {'wall s':>9}")
    for jobs, seconds in shared.items():
        print(f"{f'shared, --jobs {jobs}':<28} {seconds:>9.0f}")
    print(f"{'one run per attack':<28} {sum(separate.values()):>9.0f}")
    if 1 in shared:
        print(f"one run per attack / shared --jobs 1: {sum(separate.values()) / shared[1]:.2f}x")
    print(f"\n{'cell':<36} {'attacks':>7} {'one run per attack s':>21}")
    for cell in cells:
        print(f"{cell.id:<36} {len(cell.attacks):>7} {separate[cell.id]:>21.0f}")


if __name__ == "__main__":
    main()
