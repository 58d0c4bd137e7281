"""The README's headline tables, measured over seeds with 95 % intervals: each row is ``fdattack run ... seeds=[...]``
(a replica per seed and their aggregate, :mod:`fdattack.seeds`), and the script prints each table in Markdown with
every figure as ``mean [low, high]`` (the t interval across the seeds) and which differences survive. A seed fixes the
partition, the targets and the public rounds, so two rows of a table are compared seed by seed: a difference survives
when the t interval of the per-seed differences excludes 0 (and, more strictly, when the two rows' own intervals do
not overlap).

Rows run one after the other, each replica with one thread; the output root keeps every run, so the script can be
stopped and started again: finished replicas are read, a cut one resumes. A row takes 2 (the default run) to 12
(PDA-FD's MNIST) minutes per seed on a 2-core CPU (AT&T faces: about 7). The defense table's undefended row is the
PLI table's AT&T FedMD row, read from there (run last, so that two copies of the script, one per table, can share a
root: ``--tables pli`` beside ``--tables defenses``).

Usage: ``python benchmarks/headline_tables.py [--tables default pli defenses pdafd] [--seeds 0 1 2] [--root runs/headline]
[--override trainer.accelerator=gpu ...] [--read-only]`` (``pli``, ``defenses`` and ``pdafd`` read AT&T faces and MNIST
where their experiment files say: ``../shared/data``). ``--override`` adds overrides to every run; ``--read-only``
prints the tables of the runs already under ``--root`` (for instance ones measured on another machine) and runs nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fdattack.functional.intervals import t_interval

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Row:
    """One row: a name, the experiment file (None: the embedded default), its overrides, for a row that another
    table runs too, that table's folder of it (``table/row``; its runs are read there, not run twice), and its group:
    rows are compared seed by seed only within a group (the same data, so the same seed draws the same targets)."""

    name: str
    experiment: str | None
    overrides: tuple[str, ...] = ()
    home: str | None = None
    group: str = ""


#: per table: its rows and the metrics shown (metric key, column title)
TABLES: dict[str, tuple[list[Row], list[tuple[str, str]]]] = {
    "default": (
        [Row("fedmd_digits (the default run, with the public mean)", None, ("attacks=[pli,tbi,ldia,public_mean]",))],
        [
            ("attack/pli/accuracy", "PLI acc."),
            ("attack/pli/eval_top1", "PLI eval top-1"),
            ("attack/tbi/accuracy", "TBI acc."),
            ("attack/public_mean/accuracy", "public mean acc."),
            ("attack/pli/chance", "chance"),
            ("attack/ldia/kl", "LDIA KL"),
            ("attack/ldia/uniform_kl", "uniform KL"),
            ("protocol/client_acc_mean", "client acc."),
        ],
    ),
    "pli": (
        [
            Row(f"{data} {protocol}", f"conf/experiment/pli_{protocol}_{data}.yaml", group=data)
            for data in ("att_faces", "mnist")
            for protocol in ("fedmd", "fedgems", "dsfl")
        ],
        [
            ("attack/pli/accuracy", "PLI acc."),
            ("attack/pli/ssim", "PLI SSIM"),
            ("attack/pli/prior_accuracy", "prior acc."),
            ("attack/tbi/accuracy", "TBI acc."),
            ("attack/pli/eval_top1", "PLI eval top-1"),
            ("protocol/client_acc_mean", "client acc."),
        ],
    ),
    "defenses": (
        [
            Row(f"Laplace b = {b}", "conf/experiment/pli_fedmd_att_faces.yaml", ("defenses=[laplace]", f"defense.laplace.scale={b}"))
            for b in (1.0, 2.0, 0.5)
        ]
        + [Row(f"top-{k}", "conf/experiment/pli_fedmd_att_faces.yaml", ("defenses=[topk]", f"defense.topk.k={k}")) for k in (1, 3)]
        + [Row("none", "conf/experiment/pli_fedmd_att_faces.yaml", home="pli/att_faces_fedmd")],
        [
            ("attack/pli/accuracy", "PLI acc."),
            ("attack/pli/ssim", "PLI SSIM"),
            ("attack/tbi/accuracy", "TBI acc."),
            ("protocol/client_acc_mean", "client acc."),
        ],
    ),
    "pdafd": (
        [
            Row(protocol, f"conf/experiment/ldia_lira_{protocol}_mnist.yaml", ("protocol.rounds=5", "data.dirichlet_alpha=1"))
            for protocol in ("fedmd", "dsfl", "cronus")
        ],
        [
            ("attack/ldia/kl", "LDIA KL"),
            ("attack/ldia/uniform_kl", "uniform KL"),
            ("attack/lira_distill/tpr_at_1pct_fpr", "distill. LiRA TPR@1%"),
            ("attack/lira_distill/auc", "distill. LiRA AUC"),
            ("protocol/client_acc_mean", "client acc."),
        ],
    ),
}


#: per table: the baselines each row's attack is compared with, seed by seed (metric, baseline metric, title)
BASELINES: dict[str, list[tuple[str, str, str]]] = {
    "default": [
        ("attack/pli/accuracy", "attack/pli/chance", "PLI acc. − chance"),
        ("attack/ldia/kl", "attack/ldia/uniform_kl", "LDIA KL − uniform KL"),
    ],
    "pli": [
        ("attack/pli/accuracy", "attack/pli/prior_accuracy", "PLI acc. − prior acc."),
        ("attack/pli/accuracy", "attack/pli/chance", "PLI acc. − chance"),
        ("attack/tbi/accuracy", "attack/tbi/chance", "TBI acc. − chance"),
    ],
    "defenses": [("attack/pli/accuracy", "attack/pli/chance", "PLI acc. − chance")],
    "pdafd": [
        ("attack/ldia/kl", "attack/ldia/uniform_kl", "LDIA KL − uniform KL"),
        ("attack/ldia/kl", "attack/ldia/random_kl", "LDIA KL − random KL"),
    ],
}


def folder_name(row: Row) -> str:
    return "".join(c if c.isalnum() else "_" for c in row.name).strip("_")


def row_folder(row: Row, root: Path, table: str) -> Path:
    """Where the row's aggregate and replicas live: its table's folder under ``root``, or its home."""
    return root / (row.home or f"{table}/{folder_name(row)}")


def run_row(row: Row, seeds: list[int], out: Path, overrides: list[str]) -> None:
    """Run (or continue) the row's replicas and their aggregate in ``out``."""
    cmd = [
        sys.executable,
        "-m",
        "fdattack",
        "run",
        *([row.experiment] if row.experiment else []),
        *row.overrides,
        f"seeds=[{','.join(map(str, seeds))}]",
        f"output_dir={out}",
        "logger.wandb.mode=disabled",
        "logger.progress=never",
        *overrides,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{row.name}: fdattack run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    print(f"  {row.name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)


def cell(metrics: dict, key: str) -> str:
    value, low, high = metrics.get(key), metrics.get(key + "_ci_low"), metrics.get(key + "_ci_high")
    if value is None or not math.isfinite(value):
        return "–"
    interval = (
        f" [{low:.3g}, {high:.3g}]" if low is not None and high is not None and math.isfinite(low) and f"{low:.3g}" != f"{high:.3g}" else ""
    )
    return f"{value:.3g}{interval}"


def separated(a: dict, b: dict, key: str) -> bool:
    """Whether the two rows' intervals across the seeds of ``key`` do not overlap."""
    try:
        return a[key + "_ci_high"] < b[key + "_ci_low"] or b[key + "_ci_high"] < a[key + "_ci_low"]
    except (KeyError, TypeError):
        return False


def per_seed(folder: Path) -> dict[str, dict[int, float]]:
    """Each metric's value per seed, from the aggregate's ``seeds.csv``."""
    with (folder / "seeds.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {
        row["metric"]: {
            int(column.removeprefix("seed_")): float(value) for column, value in row.items() if column.startswith("seed_") and value
        }
        for row in rows
    }


def paired_difference(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float] | None:
    """Mean and t interval of ``a - b`` over the seeds both have (None with fewer than two; no spread gives [d, d])."""
    seeds = sorted(set(a) & set(b))
    differences = [a[seed] - b[seed] for seed in seeds if math.isfinite(a[seed] - b[seed])]
    low, high = t_interval(differences)
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    return sum(differences) / len(differences), low, high


def excludes_zero(difference: tuple[float, float, float] | None) -> bool:
    return difference is not None and not difference[1] <= 0 <= difference[2]


def show(difference: tuple[float, float, float]) -> str:
    return f"{difference[0]:+.3g} [{difference[1]:+.3g}, {difference[2]:+.3g}]"


def baseline_comparisons(results: list[tuple[Row, Path]], baselines: list[tuple[str, str, str]]) -> list[str]:
    """Each row's attack against its baselines, seed by seed: every comparison, surviving or not."""
    lines = []
    for row, folder in results:
        values = per_seed(folder)
        for key, baseline, title in baselines:
            difference = paired_difference(values.get(key, {}), values.get(baseline, {}))
            if difference is not None:
                lines.append(f"{row.name}, {title}: {show(difference)} ({'survives' if excludes_zero(difference) else 'within noise'})")
    return lines


def surviving_differences(results: list[tuple[Row, Path]], columns: list[tuple[str, str]]) -> list[str]:
    """Every pair of rows of one group and metric whose per-seed difference has a t interval excluding 0, as
    ``a − b: d [low, high]`` (a star where the rows' own intervals do not overlap either)."""
    values = [(row, per_seed(folder), json.loads((folder / "metrics.json").read_text())) for row, folder in results]
    lines = []
    for i, (a, seeds_a, metrics_a) in enumerate(values):
        for b, seeds_b, metrics_b in values[i + 1 :]:
            if a.group != b.group:
                continue
            for key, title in columns:
                difference = paired_difference(seeds_a.get(key, {}), seeds_b.get(key, {}))
                if excludes_zero(difference):
                    star = " *" if separated(metrics_a, metrics_b, key) else ""
                    lines.append(f"{a.name} − {b.name}, {title}: {show(difference)}{star}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "headline")
    parser.add_argument("--override", nargs="*", default=[], help="overrides added to every run, e.g. trainer.accelerator=gpu")
    parser.add_argument("--read-only", action="store_true", help="print the tables of the runs under --root; run nothing")
    args = parser.parse_args()
    for table in args.tables:
        rows, columns = TABLES[table]
        results = [(row, row_folder(row, args.root, table)) for row in rows]
        if not args.read_only:
            print(f"running table {table} ({len(rows)} rows x {len(args.seeds)} seeds)", file=sys.stderr)
            for row, folder in results:
                run_row(row, args.seeds, folder, args.override)
        print(f"\n### {table}: mean over seeds {', '.join(map(str, args.seeds))} [95 % t interval across the seeds]\n")
        print("| row | " + " | ".join(title for _, title in columns) + " |")
        print("|---|" + "---|" * len(columns))
        for row, folder in results:
            metrics = json.loads((folder / "metrics.json").read_text())
            print(f"| {row.name} | " + " | ".join(cell(metrics, key) for key, _ in columns) + " |")
        print("\nEach row against its baselines (per-seed difference, 95 % t interval):")
        print("\n".join(f"- {line}" for line in baseline_comparisons(results, BASELINES[table])))
        surviving = surviving_differences(results, columns)
        print("\nDifferences between rows that survive (per-seed difference, 95 % t interval; * own intervals apart too):")
        print("\n".join(f"- {line}" for line in surviving) if surviving else "none")


if __name__ == "__main__":
    main()
