"""Co-op LiRA against evasive clients on real MNIST, over the decoy rate and seeds, with paired differences to no evasion.

The setting is ``conf/experiment/lira_evasive_dsfl_mnist.yaml`` (DS-FL, 10 clients, Dirichlet(10), one round, every
client evasive; Shi et al., PoPETs 2025, §5.5). Each (condition, seed) is one ``fdattack run``: no evasion
(``protocol.evasive_clients=none``), then evasion at each decoy rate (``protocol.evasion_decoys``: decoys withheld per
withheld member; ``inf`` withholds every candidate) scored by each countermeasure. A withheld candidate ranks above
every answered one, a predicted member (the server knows the evasion rule), so the table shows what withholding gives
away at each rate.

Per condition: the mean over seeds of ``lira_coop``'s AUC and TPR at 1 % FPR, with a 95 % t interval on the logit
scale (a rate stays in [0, 1]; none where a seed sits at 0 or 1, or all agree), the per-seed values and their range,
then the mean of the per-seed differences to no evasion with its t interval (* where it excludes 0).

Runs are kept under ``--root`` (a folder per condition and seed), so the script can be stopped and started again;
a kept run is never re-run, so give a new root after changing the protocol's or the attack's code. ``--jobs`` runs
go at once (default 2), each on one thread; a run takes 1-2.5 minutes on one core of a busy 2-core machine
(``neighbours`` 5-8: 16 noisy copies of every candidate go to every client), the default table about 80 minutes.

Usage: ``python benchmarks/evasion_decoys.py [--seeds 0 1 2] [--root runs/evasion_decoys] [--decoys 0 1 4 8 16 inf]
[--countermeasure-decoys 1 inf] [--jobs 2] [--existing]`` (reads MNIST from ``../shared/data/mnist_t10k``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import numpy as np
from scipy import special, stats

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = REPO / "conf" / "experiment" / "lira_evasive_dsfl_mnist.yaml"
CLEAN = "no_evasion"
COUNTERMEASURES = ("none", "shadow_target", "neighbours")
#: (metric key, column title)
METRICS = [("attack/lira_coop/auc", "AUC"), ("attack/lira_coop/tpr_at_1pct_fpr", "TPR@1%FPR")]
WITHHELD = "attack/lira_coop/withheld_fraction"


def condition_name(countermeasure: str, decoys: str) -> str:
    return f"{countermeasure}_decoys_{decoys}"


def overrides(condition: str) -> list[str]:
    """The ``fdattack run`` overrides of a condition: no evasion, or a countermeasure at a decoy rate."""
    if condition == CLEAN:
        return ["protocol.evasive_clients=none"]
    countermeasure, decoys = condition.split("_decoys_")
    return [f"attack.lira_coop.countermeasure={countermeasure}", f"protocol.evasion_decoys={decoys}"]


def run(condition: str, seed: int, root: Path, existing: bool) -> Optional[dict]:
    """The metrics of one (condition, seed) run, running it unless its folder holds them (None: not run, ``existing``)."""
    out = root / f"{condition}_seed{seed}"
    if not (out / "metrics.json").exists():
        if existing:
            return None
        cmd = [
            sys.executable,
            "-m",
            "fdattack",
            "run",
            str(EXPERIMENT),
            *overrides(condition),
            f"seed={seed}",
            f"output_dir={out}",
            *(["resume=true"] if (out / "checkpoints").is_dir() else []),
            "logger.wandb.mode=disabled",
            "logger.progress=never",
        ]
        threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **threads}, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{condition}, seed {seed}: fdattack run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        print(f"  {condition}, seed {seed}: done", file=sys.stderr)
    return json.loads((out / "metrics.json").read_text())


def decoy_rate(text: str) -> str:
    """A ``--decoys`` value as given (it names the run folder), once checked to be a number >= 0 or inf."""
    try:
        ok = float(text) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed a number >= 0 or inf")
    return text


def logit_t_interval(values: list[float]) -> Optional[tuple[float, float]]:
    """The 95 % t interval of the mean logit, mapped back to [0, 1]; None where a value is 0 or 1 or all are equal."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or np.any((v <= 0) | (v >= 1)) or np.ptp(v) == 0:
        return None
    logits = special.logit(v)
    low, high = stats.t.interval(0.95, len(v) - 1, loc=logits.mean(), scale=stats.sem(logits))
    return float(special.expit(low)), float(special.expit(high))


def rate_cell(values: list[float]) -> str:
    interval = logit_t_interval(values)
    spread = f"{min(values):.3f}–{max(values):.3f}"
    around = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""
    return f"{np.mean(values):.3f}{around} ({' / '.join(f'{x:.3f}' for x in values)}; {spread})"


def difference_cell(diffs: list[float]) -> str:
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2 or np.ptp(d) == 0:
        return f"{d.mean():+.3f}"
    low, high = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    return f"{d.mean():+.3f} [{low:+.3f}, {high:+.3f}]{' *' if low > 0 or high < 0 else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "evasion_decoys")
    parser.add_argument(
        "--decoys", nargs="+", type=decoy_rate, default=["0", "1", "4", "8", "16", "inf"], help="rates scored with countermeasure=none"
    )
    parser.add_argument(
        "--countermeasure-decoys",
        nargs="+",
        type=decoy_rate,
        default=["1", "inf"],
        help="rates also scored with shadow_target and neighbours",
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--existing", action="store_true", help="run nothing: tabulate the runs already under --root")
    args = parser.parse_args()
    conditions = [CLEAN, *(condition_name("none", r) for r in args.decoys)]
    conditions += [condition_name(c, r) for c in COUNTERMEASURES[1:] for r in args.countermeasure_decoys]
    cells = [(c, s) for c in conditions for s in args.seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        found = dict(zip(cells, pool.map(lambda cell: run(*cell, args.root, args.existing), cells)))
    results = {c: [found[c, s] for s in args.seeds] for c in conditions if all(found[c, s] is not None for s in args.seeds)}
    if CLEAN not in results:
        raise SystemExit(f"no complete set of {CLEAN} runs under {args.root} (seeds {args.seeds})")
    print(f"\n### Co-op LiRA (lira_coop) vs evasive clients, DS-FL on MNIST (10 clients, Dirichlet(10), round 1), seeds {args.seeds}")
    print(
        "\nmean [95 % t interval on the logit scale] (per seed; min–max); withheld: mean fraction of the candidates each client withheld\n"
    )
    print("| condition | withheld | " + " | ".join(title for _, title in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for condition, runs in results.items():
        withheld = np.mean([r.get(WITHHELD, 0.0) for r in runs])
        print(f"| {condition} | {withheld:.3f} | " + " | ".join(rate_cell([r[key] for r in runs]) for key, _ in METRICS) + " |")
    print(f"\nPaired per-seed differences to {CLEAN} (condition − {CLEAN}), mean [95 % t interval]; * where it excludes 0:\n")
    for condition, runs in results.items():
        if condition != CLEAN:
            diffs = {title: [r[key] - n[key] for r, n in zip(runs, results[CLEAN])] for key, title in METRICS}
            print(f"- {condition}: " + "; ".join(f"{title} {difference_cell(d)}" for title, d in diffs.items()))
    missing = [c for c in conditions if c not in results]
    if missing:
        print(f"\n(not yet complete under {args.root}: {', '.join(missing)})")


if __name__ == "__main__":
    main()
