"""The README's headline tables, measured over seeds with 95 % intervals: each row is ``fdattack run ... seeds=[...]``
(a replica per seed and their aggregate, :mod:`fdattack.seeds`), and the script prints each table in Markdown with
every figure as ``mean [low, high]`` (the t interval across the seeds) and which differences survive: two rows'
figures differ beyond noise when their intervals across the seeds do not overlap.

Rows run one after the other, each replica with one thread; the output root keeps every run, so the script can be
stopped and started again: finished replicas are read, a cut one resumes. A row takes 2 (the default run) to 12
(PDA-FD's MNIST) minutes per seed on a 2-core CPU (AT&T faces: about 7). The defense table's undefended row is the
PLI table's AT&T FedMD row, read from there (run last, so that two copies of the script, one per table, can share a
root: ``--tables pli`` beside ``--tables defenses``).

Usage: ``python benchmarks/headline_tables.py [--tables default pli defenses pdafd] [--seeds 0 1 2] [--root runs/headline]``
(``pli``, ``defenses`` and ``pdafd`` read AT&T faces and MNIST where their experiment files say: ``../shared/data``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Row:
    """One row: a name, the experiment file (None: the embedded default), its overrides and, for a row that another
    table runs too, that table's folder of it (``table/row``; its runs are read there, not run twice)."""

    name: str
    experiment: str | None
    overrides: tuple[str, ...] = ()
    home: str | None = None


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
            Row(f"{data} {protocol}", f"conf/experiment/pli_{protocol}_{data}.yaml")
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


def folder_name(row: Row) -> str:
    return "".join(c if c.isalnum() else "_" for c in row.name).strip("_")


def run_row(row: Row, seeds: list[int], root: Path, table: str) -> dict:
    """Run (or continue) the row's replicas under ``root`` (in its table's folder, or its home); returns their aggregate."""
    out = root / (row.home or f"{table}/{folder_name(row)}")
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
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{row.name}: fdattack run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    print(f"  {row.name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return json.loads((out / "metrics.json").read_text())


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "headline")
    args = parser.parse_args()
    for table in args.tables:
        rows, columns = TABLES[table]
        print(f"running table {table} ({len(rows)} rows x {len(args.seeds)} seeds)", file=sys.stderr)
        results = [(row, run_row(row, args.seeds, args.root, table)) for row in rows]
        print(f"\n### {table}: mean over seeds {', '.join(map(str, args.seeds))} [95 % t interval across the seeds]\n")
        print("| row | " + " | ".join(title for _, title in columns) + " |")
        print("|---|" + "---|" * len(columns))
        for row, metrics in results:
            print(f"| {row.name} | " + " | ".join(cell(metrics, key) for key, _ in columns) + " |")
        surviving = [
            f"{a.name} vs {b.name}: {title}"
            for i, (a, ma) in enumerate(results)
            for b, mb in results[i + 1 :]
            for key, title in columns
            if separated(ma, mb, key)
        ]
        print("\nDifferences whose intervals do not overlap: " + ("; ".join(surviving) if surviving else "none"))


if __name__ == "__main__":
    main()
