"""A leakage matrix run in process and isolated (``fdattack matrix --isolation process``): its time, and its answers.

It takes a matrix preset (default ``conf/matrix/small.yaml``) without its defense curves (the undefended cells and their
controls: where each attack's leak is decided), at the file's seeds, and runs it twice from empty roots, in process and
with every simulation's attacks in sandboxed workers, ``--jobs`` simulations at a time. It prints the wall time of
each and their ratio, then each attack's undefended verdict against its control at each place, in both, and how many
agree. The isolated attacks draw from a secret of each run's (``attack_seed``), so the numbers
differ by the attacks' randomness; a verdict that differs is one that the seeds do not settle.

Run it on an otherwise idle machine and note the machine: ``python benchmarks/bench_matrix_isolation.py [--jobs 2]
[--preset conf/matrix/small.yaml] [--data att_faces mnist] [--seeds 0 1 2] [--root /tmp/bench]``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fdattack.matrix.answer import answers, difference_text  # noqa: E402


def undefended(preset: Path, folder: Path, data: list[str] | None, seeds: list[int] | None) -> Path:
    """``preset`` with its ``defenses`` axis cut to ``none``, no ``decide``, and only ``data``'s settings and ``seeds``
    where given: a file of its own in ``folder``."""
    spec = yaml.safe_load(preset.read_text())
    spec["name"] = f"{spec['name']}_undefended"
    spec["defenses"] = {"none": []}
    spec.pop("decide", None)
    spec["skip"] = [p for p in spec.get("skip", []) if fnmatch.fnmatch("none", (p.split("/") + ["*", "*"])[2])]  # none's only
    if data:
        spec["data"] = {name: spec["data"][name] for name in data}
        control = {name: o for name, o in (spec.pop("control", None) or {}).items() if name in data}
        if control:
            spec["control"] = control
        spec["skip"] = [s for s in spec.get("skip", []) if s.split("/")[0].strip('"') in data]
    if seeds:
        spec["seeds"] = seeds
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run(matrix: Path, root: Path, jobs: int, isolation: str) -> float:
    """Wall seconds of ``fdattack matrix`` on ``matrix`` into ``root``."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "fdattack", "matrix", str(matrix), "--root", str(root), "--jobs", str(jobs), "--isolation", isolation]
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def verdicts(root: Path) -> dict[str, str]:
    """Each attack's undefended verdict against its control at each place (``matrix.json``'s answers), by
    ``data/protocol attack metric``, with the difference and its interval."""
    matrix = json.loads((root / "matrix.json").read_text())
    return {
        f"{a.data}/{a.protocol} {a.metric.removeprefix('attack/')}": f"{a.decision.verdict.value}, {difference_text(a.decision)}"
        for a in answers(matrix)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", type=Path, default=REPO / "conf" / "matrix" / "small.yaml")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--root", type=Path, default=None, help="where the two matrices go (default: a temporary folder)")
    parser.add_argument("--data", nargs="*", default=None, help="only these data settings of the preset (default: all)")
    parser.add_argument("--seeds", nargs="*", type=int, default=None, help="these seeds (default: the preset's)")
    options = parser.parse_args()
    folder = options.root or Path(tempfile.mkdtemp(prefix="fdattack-bench-matrix-isolation-"))
    folder.mkdir(parents=True, exist_ok=True)
    matrix = undefended(options.preset, folder, options.data, options.seeds)
    seconds = {mode: run(matrix, folder / mode, options.jobs, mode) for mode in ("in_process", "process")}
    print("| mode | wall | / in process |\n|---|---|---|")
    for mode, wall in seconds.items():
        print(f"| {mode} | {wall / 60:.1f} min | {wall / seconds['in_process']:.2f}x |")
    inside, isolated = verdicts(folder / "in_process"), verdicts(folder / "process")
    print("\n| comparison | in process | isolated |\n|---|---|---|")
    for key in sorted(inside):
        print(f"| {key} | {inside[key]} | {isolated.get(key, '-')} |")
    same = sum(inside[key].split(",")[0] == isolated.get(key, "").split(",")[0] for key in inside)
    print(f"\n{same} of {len(inside)} verdicts agree ({folder})")


if __name__ == "__main__":
    main()
