"""The plain L-Attack on MNIST under three attack schedules: the paper's Algorithm 1 against the victim isolated in every round.

The L-Attack has no public code, so fdattack's side is set against the paper itself (``specs/lattack.md`` §2.1).
Algorithm 1 attacks in "certain communication rounds" and returns the real average in the others, and adds the
generator's images to the public set every round. The spec's default attacks every round, which isolates the victim.
For each seed the driver runs ``conf/experiment/lattack_fedmd_mnist.yaml`` (victim client 0, c* = 0, 2,000 generator
steps in every schedule) under

* ``isolated``: ``every=1``, 200 steps a round, no fakes: the victim distils toward its own logits in every round;
* ``between``: ``every=2``, 400 steps a round, no fakes: normal FedMD rounds between the attack rounds;
* ``algorithm1``: ``every=2``, 400 steps a round, 200 generated images added to the next public batch (the config),

one after the other, each in a subprocess on one thread, and prints the all-digit SCNN's top-1 on the 64 images
(chance 0.1), the centred feature cosine to the real 0s and the noise's (§5.1), the FID in the SCNN's features, the
clients' mean accuracy, wall time and peak RSS, with 95 % intervals over the seeds (each metric's kind) and the seed-by-seed differences
of ``algorithm1`` from the others.

Usage::

    python benchmarks/peers/lattack/run.py --out DIR [--seeds 0 1 2] [--schedules isolated between algorithm1]
    python benchmarks/peers/lattack/run.py --out DIR --table-only     # reprint the table from saved runs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/peers: the drivers' shared helpers
from common import fmt, run_child  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
EXPERIMENT = REPO / "conf" / "experiment" / "lattack_fedmd_mnist.yaml"
#: schedule -> overrides of EXPERIMENT; each takes 2,000 generator steps in 10 rounds
SCHEDULES = {
    "isolated": ["attack.lattack.every=1", "attack.lattack.steps_per_round=200", "attack.lattack.inject_samples=0"],
    "between": ["attack.lattack.every=2", "attack.lattack.steps_per_round=400", "attack.lattack.inject_samples=0"],
    "algorithm1": ["attack.lattack.every=2", "attack.lattack.steps_per_round=400", "attack.lattack.inject_samples=200"],
}
#: column -> the run's metric (the last value logged)
METRICS = {
    "SCNN top-1": "attack/lattack/top1",
    "feature cos.": "attack/lattack/feature_cosine",
    "noise cos.": "attack/lattack/feature_cosine_noise",
    "FID": "attack/lattack/fid",
    "client acc.": "protocol/client_acc_mean",
}
#: the metric whose kind sets each column's interval (fdattack/statistics/kinds.py)
KINDS = {**METRICS, "wall s": "wall_s", "peak RSS MiB": "peak_rss_mib"}


def run_one(out: Path, schedule: str, seed: int) -> None:
    """One run of EXPERIMENT under ``schedule`` at ``seed`` in ``out/<schedule>_seed<seed>/``; its cost in ``cost.json``."""
    run = out / f"{schedule}_seed{seed}"
    cmd = [sys.executable, "-m", "fdattack", "run", str(EXPERIMENT), f"seed={seed}", f"output_dir={run}", "logger.progress=never"]
    measured = run_child([*cmd, "logger.wandb.mode=disabled", *SCHEDULES[schedule]], REPO, out / f"{schedule}_seed{seed}.log")
    (run / "cost.json").write_text(json.dumps({"wall_s": measured.wall_s, "peak_rss_mib": measured.peak_rss_mib}))


def results(run: Path) -> dict[str, float]:
    """The last logged value of each of METRICS and the run's cost."""
    last: dict[str, float] = {}
    for line in (run / "rounds.jsonl").read_text().splitlines():
        last.update(json.loads(line))
    cost = json.loads((run / "cost.json").read_text())
    return {**{column: last[key] for column, key in METRICS.items()}, "wall s": cost["wall_s"], "peak RSS MiB": cost["peak_rss_mib"]}


def table(out: Path, schedules: list[str], seeds: list[int]) -> str:
    """The markdown table: per schedule, mean [95 % interval of each metric's kind] over the seeds and the per-seed values; then the paired
    differences of ``algorithm1`` from each other schedule."""
    found = {s: {k: results(out / f"{s}_seed{k}") for k in seeds if (out / f"{s}_seed{k}" / "cost.json").exists()} for s in schedules}
    columns = [*METRICS, "wall s", "peak RSS MiB"]
    whole = {"FID", "wall s", "peak RSS MiB"}  # printed with fewer digits
    lines = ["| schedule | seeds | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for schedule, runs in found.items():
        if len(runs) < 2:
            continue
        cells = [fmt([r[c] for r in runs.values()], 1 if c in whole else 3, key=KINDS[c]) for c in columns]
        lines.append(f"| {schedule} | {', '.join(map(str, runs))} | " + " | ".join(cells) + " |")
        for seed, r in runs.items():
            lines.append(f"| | {seed} | " + " | ".join(f"{r[c]:.0f}" if c in whole else f"{r[c]:.3f}" for c in columns) + " |")
    reference = found.get("algorithm1", {})
    for schedule, runs in found.items():
        common = sorted(set(runs) & set(reference))
        if schedule == "algorithm1" or len(common) < 2:
            continue
        lines.append(f"\nalgorithm1 − {schedule}, seed by seed ({', '.join(map(str, common))}):")
        for column in ("SCNN top-1", "feature cos.", "FID", "client acc."):
            differences = [reference[k][column] - runs[k][column] for k in common]
            lines.append(f"* {column}: {fmt(differences, 1 if column == 'FID' else 3)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs, their logs and table.md")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--schedules", nargs="+", choices=sorted(SCHEDULES), default=list(SCHEDULES))
    parser.add_argument("--table-only", action="store_true", help="print the table from the runs already in --out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        for seed in args.seeds:
            for schedule in args.schedules:
                print(f"{schedule}, seed {seed} ...", flush=True)
                run_one(args.out, schedule, seed)
    text = table(args.out, args.schedules, args.seeds)
    (args.out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
