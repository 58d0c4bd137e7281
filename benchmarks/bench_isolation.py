"""What running each attack in a worker process of its own (``isolation.mode=process``) costs and gains.

For four runs — the embedded default (``fdattack run``: PLI, TBI and LDIA on the digits), one AT&T faces cell of the
small matrix (``conf/matrix/small.yaml``, FedMD without defense: six attacks), the PDA-FD digits run
(``conf/experiment/ldia_lira_fedmd_digits.yaml``) and the default on DS-FL (whose clients train before they upload, so
an overlapping worker's round end has the next round's training beside it) — it times ``fdattack run`` in process,
isolated, and isolated with ``isolation.overlap=true``, rotating the modes' order ``--repeats`` times, and samples the
resident memory of the whole process tree (the run, the zygote and the workers): RSS twice a second, PSS every 3 s.
It prints, per run and mode, the median wall time and peak memory with their range, and each mode's ratio of the
medians to in process; and it checks that every mode gave the in-process metrics. Memory is the peak over the run of
the tree's RSS (a library page mapped by several processes counted in each) and of its PSS (shared pages split among
the processes that map them: what the tree really holds).

Every run gets ``OMP_NUM_THREADS=--threads`` (default: the machine's cores), the workers the run's thread count. Run
it on an otherwise idle machine and note the machine.

Usage: ``python benchmarks/bench_isolation.py [--repeats 3] [--threads 2] [--runs default att_faces pdafd_digits dsfl_digits]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fdattack.matrix.plan import plan_cell  # noqa: E402
from fdattack.matrix.spec import load_matrix  # noqa: E402

QUIET = ["logger.wandb.mode=disabled", "logger.progress=never"]


def runs() -> dict[str, list[str]]:
    """The ``fdattack run`` arguments of each benchmarked run."""
    spec = load_matrix(REPO / "conf" / "matrix" / "small.yaml")
    cell = plan_cell(spec, "att_faces", "fedmd", "none")
    return {
        "default": [],
        "att_faces": [*([str(cell.experiment)] if cell.experiment else []), *cell.overrides, "seed=0"],
        "pdafd_digits": [str(REPO / "conf" / "experiment" / "ldia_lira_fedmd_digits.yaml")],
        "dsfl_digits": ["protocol=dsfl"],
    }


#: the benchmarked modes and their overrides (one attacks' seed for all: an isolated run's is otherwise a secret of its own)
MODES = {
    "in_process": ["isolation.mode=in_process", "attack_seed=42"],
    "process": ["isolation.mode=process", "attack_seed=42"],
    "overlap": ["isolation.mode=process", "isolation.overlap=true", "attack_seed=42"],
}


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def tree_memory_mb(root: int, proportional: bool) -> float:
    """Resident memory of ``root`` and its descendants in MiB: RSS (``/proc/<pid>/statm``, cheap), or with
    ``proportional`` PSS (``smaps_rollup``, which walks each process's page tables and stalls it meanwhile: sampled
    seldom). RSS counts a shared page (torch's libraries, mapped by the run and by every worker) in each process that
    maps it; PSS splits it among them, so it adds up across processes."""
    total = 0.0
    for pid in tree_pids(root):
        try:
            if proportional:
                lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
                total += int(dict(line.split(":", 1) for line in lines).get("Pss", "0 kB").split()[0]) / 1024
            else:
                total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        except (OSError, ValueError, IndexError):
            continue
    return total


def timed_run(args: list[str], out: Path, threads: int) -> tuple[float, tuple[float, float], dict]:
    """Wall seconds, peak tree memory (RSS and PSS, MiB) and final metrics of one ``fdattack run``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "fdattack", "run", *args, *QUIET, f"output_dir={out}"]
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak, done = [0.0, 0.0], threading.Event()

    def sample() -> None:
        ticks = 0
        while not done.wait(0.5):
            ticks += 1
            peak[0] = max(peak[0], tree_memory_mb(proc.pid, proportional=False))
            if ticks % 6 == 0:  # PSS every 3 s: its reads stall the processes they read
                peak[1] = max(peak[1], tree_memory_mb(proc.pid, proportional=True))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, errors = proc.communicate()
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{errors[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return wall, (peak[0], peak[1]), {k: v for k, v in metrics.items() if not k.startswith("time/")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--runs", nargs="+", default=list(runs()))
    options = parser.parse_args()
    chosen = {name: args for name, args in runs().items() if name in options.runs}
    print(f"{len(chosen)} runs x {len(MODES)} modes x {options.repeats} repeats, OMP_NUM_THREADS={options.threads}, {os.cpu_count()} cores")
    table = []
    with tempfile.TemporaryDirectory(prefix="bench-isolation-") as scratch:
        for name, args in chosen.items():
            measured: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
            metrics: dict[str, dict] = {}
            for repeat in range(options.repeats):
                order = list(MODES)[repeat % len(MODES) :] + list(MODES)[: repeat % len(MODES)]
                for mode in order:
                    out = Path(scratch) / f"{name}-{mode}-{repeat}"
                    wall, (rss, pss), metrics[mode] = timed_run([*args, *MODES[mode]], out, options.threads)
                    measured[mode].append((wall, rss, pss))
                    print(
                        f"  {name:<13} {mode:<10} repeat {repeat}: {wall:6.1f} s, peak RSS {rss:6.0f} MiB, PSS {pss:6.0f} MiB", flush=True
                    )
            table.append((name, measured, all(metrics[mode] == metrics["in_process"] for mode in MODES)))
    print(f"\n{'run':<13} {'mode':<10} {'wall s, median [range]':>24} {'peak RSS MiB':>22} {'peak PSS MiB':>22} {'same metrics':>13}")
    for name, measured, same in table:
        medians = {}
        for mode in MODES:
            columns = list(zip(*measured[mode]))
            medians[mode] = [statistics.median(c) for c in columns]
            cells = [f"{statistics.median(c):8.1f} [{min(c):5.0f}-{max(c):5.0f}]" for c in columns]
            print(f"{name:<13} {mode:<10} {cells[0]:>24} {cells[1]:>22} {cells[2]:>22} {str(same):>13}")
        for mode in list(MODES)[1:]:
            ratios = [f"{p / i:8.2f} x" for p, i in zip(medians[mode], medians["in_process"])]
            print(f"{name:<13} {mode + ' / in':<10} {ratios[0]:>24} {ratios[1]:>22} {ratios[2]:>22}")


if __name__ == "__main__":
    main()
