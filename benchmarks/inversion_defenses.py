"""GAN model inversion (GMI, KED-MI) against FedAvg on real MNIST under MID and BiDO, over seeds, with paired differences.

The setting is the shrunk FedInverse MNIST run of ``tests/test_fedinverse_mnist.py`` (digits 0-4 private over 5
FedAvg clients, 5-9 the attacker's prior set, 16 px, 200 images per digit, one round), both attacks in one run.
Each (defense, seed) is one ``fdattack run``; the evaluation classifier (an SCNN on all ten digits) and the private
data depend on the seed alone, so a defense and the undefended run at the same seed are scored by the same network
and compared pairwise: the table gives, per metric, the mean over the seeds with its t interval, then the mean of
the per-seed differences to the undefended run with theirs (a difference survives when its interval excludes 0).

Runs are kept under ``--root`` (a folder per defense and seed), so the script can be stopped and started again; a
kept run is never re-run, so give a new root after changing the attacks' or defenses' code, or the pairs would mix
two versions. A run takes about 3 minutes on one core of a 2-core CPU.

Usage: ``python benchmarks/inversion_defenses.py [--defenses none mid bido] [--seeds 0 1 2] [--root runs/inversion_defenses]``
(reads MNIST from ``../shared/data/mnist_t10k``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from fdattack.statistics.intervals import mean_interval
from fdattack.statistics.paired import holm, paired_difference

REPO = Path(__file__).resolve().parents[1]
ATTACKS = ("kedmi", "gmi")
SMALL_MNIST = [
    "data=mnist_fedinverse",
    "data.image_size=16",
    "data.max_per_class=200",
    "protocol.num_clients=5",
    "protocol.fraction=1.0",
    "protocol.rounds=1",
    "evaluation.inversion.epochs=5",
    f"attacks=[{','.join(ATTACKS)}]",
]
SMALL_MNIST += [
    f"attack.{a}.{key}" for a in ATTACKS for key in ("gan_width=16", "gan_epochs=15", "gan_batch_size=64", "gan_lr=1e-3", "iterations=200")
]
DEFENSES = {"none": [], "mid": ["defenses=[mid]"], "mid_beta0.1": ["defenses=[mid]", "defense.mid.beta=0.1"], "bido": ["defenses=[bido]"]}
#: (metric key, column title)
METRICS = [("protocol/server_acc", "server acc.")] + [
    (f"attack/{a}/{key}", f"{a} {title}")
    for a in ATTACKS
    for key, title in (("top1", "eval top-1"), ("target_top1", "target top-1"), ("knn_dist", "KNN dist."))
]


def run(defense: str, seed: int, root: Path) -> dict:
    """The metrics of one (defense, seed) run, running it unless its folder holds them."""
    out = root / f"{defense}_{seed}"
    if not (out / "metrics.json").exists():
        cmd = [
            sys.executable,
            "-m",
            "fdattack",
            "run",
            str(REPO / "conf" / "experiment" / "kedmi_fedavg_digits.yaml"),
            *SMALL_MNIST,
            *DEFENSES[defense],
            f"seed={seed}",
            f"output_dir={out}",
            *(["resume=true"] if (out / "checkpoints").is_dir() else []),
            "logger.wandb.mode=disabled",
            "logger.progress=never",
        ]
        proc = subprocess.run(
            cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SystemExit(f"{defense}, seed {seed}: fdattack run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        print(f"  {defense}, seed {seed}: done", file=sys.stderr)
    return json.loads((out / "metrics.json").read_text())


def shown(mean: float, low: float, high: float) -> str:
    same = not math.isfinite(low) or f"{low:.3g}" == f"{high:.3g}"  # one value at every seed: no interval to show
    return f"{mean:.3g}" if same else f"{mean:.3g} [{low:.3g}, {high:.3g}]"


def mean_and_interval(key: str, values: list[float]) -> str:
    """The mean over the seeds with the 95 % interval that fits ``key``'s kind (a rate stays in [0, 1])."""
    return shown(float(np.mean(values)), *mean_interval(key, values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--defenses", nargs="+", default=["none", "mid", "bido"], choices=list(DEFENSES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "inversion_defenses")
    args = parser.parse_args()
    results = {d: [run(d, s, args.root) for s in args.seeds] for d in dict.fromkeys(["none", *args.defenses])}
    print(
        f"\n### GMI and KED-MI vs MID and BiDO, FedAvg on MNIST (16 px, 1 round): mean over seeds {args.seeds} "
        "[95 % interval of its kind: rates on the logit scale, distances on the log scale]\n"
    )
    print("| defense | " + " | ".join(title for _, title in METRICS) + " |")
    print("|---|" + "---|" * len(METRICS))
    for defense, runs in results.items():
        print(f"| {defense} | " + " | ".join(mean_and_interval(key, [r[key] for r in runs]) for key, _ in METRICS) + " |")
    print("\nPer-seed values (seeds in order):")
    for defense, runs in results.items():
        print(f"- {defense}: " + "; ".join(f"{title} " + " / ".join(f"{r[key]:.2f}" for r in runs) for key, title in METRICS))
    differences = {
        (defense, key): paired_difference([r[key] for r in runs], [n[key] for n in results["none"]])
        for defense, runs in results.items()
        if defense != "none"
        for key, _ in METRICS
    }
    survives = dict(zip(differences, holm([d.p_value if math.isfinite(d.p_value) else 1.0 for d in differences.values()])))
    print(
        f"\nPaired differences to the undefended run (defense − none, seed by seed), mean [95 % paired t interval]; "
        f"* where it survives Holm's correction over the {len(differences)} comparisons:"
    )
    for defense in results:
        if defense != "none":
            cells = [
                f"{title} {shown(d.mean, d.low, d.high)}{' *' if survives[(defense, key)] else ''}"
                for key, title in METRICS
                for d in [differences[(defense, key)]]
            ]
            print(f"- {defense}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
