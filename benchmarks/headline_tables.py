"""Every figure quoted in README.md and docs/, measured over seeds: one command regenerates them from runs.

Each table's rows are ``fdattack run ... seeds=[...]`` (a replica per seed and their aggregate, :mod:`fdattack.seeds`);
the script prints each table in Markdown, every cell as ``mean [95 % interval across the seeds]`` (the interval that
fits the metric's kind, :mod:`fdattack.statistics.kinds`) followed by each seed's value, then every comparison
the pages quote: each row against its baselines and the rows of one group against each other, seed by seed (a seed
fixes the partition, the targets and the public rounds, so the rows' per-seed values are paired): the mean of the
per-seed differences, its t interval, and whether it survives Holm's correction over all the comparisons the table
makes (:mod:`fdattack.statistics.paired`; the family's size is printed with it).

Two figure sets come from their own scripts, which this one runs the same way: ``evasion`` (Co-op LiRA against
evasive clients by decoy rate, ``benchmarks/evasion_decoys.py``) and ``matrix`` (the leakage matrix's small preset,
``fdattack matrix conf/matrix/small.yaml --jobs 2``, whose end prints the defenses' surviving paired differences with
each seed's values). The L-Attack's MNIST schedules are the ``lattack_mnist`` table (also printed by
``benchmarks/peers/lattack/run.py`` with wall time and memory).

Rows run one after the other, each replica with one thread; the output root keeps every run, so the script can be
stopped and started again: finished replicas are read (and checked against their config), a cut one resumes. A row
takes 1 (the first run) to 12 (PDA-FD's MNIST) minutes per seed on a 2-core CPU (AT&T faces: about 7). A row that
another table runs too is read from there.

What a run measured is kept in the repository, small: each row's aggregate (``seeds.csv``, every metric at every seed;
``metrics.json``) under ``results/headline/<table>/<row>/`` and the matrix's ``matrix.json`` (and ``seeds.json`` where
``--decide`` extended it) under ``results/matrix/small/``. ``--read-only`` prints the tables from there, so a fresh clone
reprints every figure the docs quote; a table with nothing kept says so and which command measures it.

Usage: ``python benchmarks/headline_tables.py [--tables default pli blur defenses few_references pdafd lattack_mnist
evasion matrix] [--seeds 0 1 2] [--root runs/headline] [--results results] [--override trainer.accelerator=gpu ...]
[--read-only]`` (the real-data tables read AT&T faces and MNIST where their experiment files say: ``../shared/data``).
``--override`` adds overrides to every run.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fdattack.matrix.answer import WORDS, answers, difference_text, per_defense, sentence
from fdattack.matrix.comparisons import comparisons_summary
from fdattack.statistics.paired import Difference, holm_adjusted, paired_difference
from fdattack.statistics.verdicts import Verdict

REPO = Path(__file__).resolve().parents[1]
#: the measured figures kept in the repository (see the module docstring)
RESULTS = REPO / "results"
#: what a row keeps of its aggregate
KEPT = ("seeds.csv", "metrics.json")


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


#: PLI on AT&T FedMD, the experiment of the blur table
ATT_PLI = "conf/experiment/pli_fedmd_att_faces.yaml"
#: PLI's best setting tried on the digits (README, "What the first run shows")
DIGITS_PLI_BEST = ("data.blur_strength=8", "attack.pli.gamma=0", "attack.pli.lr=1e-3", "attack.pli.epochs_per_round=10")
#: the L-Attack's schedules on MNIST (benchmarks/peers/lattack/run.py: the spec's default, normal rounds between, Algorithm 1)
LATTACK_SCHEDULES = {
    "isolated": ["attack.lattack.every=1", "attack.lattack.steps_per_round=200", "attack.lattack.inject_samples=0"],
    "between": ["attack.lattack.every=2", "attack.lattack.steps_per_round=400", "attack.lattack.inject_samples=0"],
    "algorithm1": ["attack.lattack.every=2", "attack.lattack.steps_per_round=400", "attack.lattack.inject_samples=200"],
}

#: per table: its rows and the metrics shown (metric key, column title)
TABLES: dict[str, tuple[list[Row], list[tuple[str, str]]]] = {
    "default": (
        [
            Row("fedmd_digits (the default run, with the public mean)", None, ("attacks=[pli,tbi,ldia,public_mean]",), group="digits"),
            Row(
                "PLI's best setting tried on the digits (blur 8, γ = 0, lr 1e-3, 10 epochs)",
                None,
                ("attacks=[pli,public_mean]", *DIGITS_PLI_BEST),
                group="digits",
            ),
        ],
        [
            ("attack/pli/accuracy", "PLI acc."),
            ("attack/pli/eval_top1", "PLI eval top-1"),
            ("attack/pli/prior_accuracy", "prior acc."),
            ("attack/tbi/accuracy", "TBI acc."),
            ("attack/public_mean/accuracy", "public mean acc."),
            ("attack/pli/ssim", "PLI SSIM"),
            ("attack/public_mean/ssim", "public mean SSIM"),
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
    "blur": (
        [
            Row(
                f"γ = 0, {b} px blur",
                "conf/experiment/pli_fedmd_att_faces.yaml",
                ("attacks=[pli]", "attack.pli.gamma=0", f"data.blur_strength={b}"),
            )
            for b in (16, 24, 32)
        ]
        + [Row("γ = 0.3, 32 px blur", ATT_PLI, ("attacks=[pli]", "data.blur_strength=32"))],
        [
            ("attack/pli/accuracy", "PLI acc."),
            ("attack/pli/prior_accuracy", "prior acc."),
            ("attack/pli/ssim", "PLI SSIM"),
            ("protocol/client_acc_mean", "client acc."),
        ],
    ),
    "lattack_mnist": (
        [Row(name, "conf/experiment/lattack_fedmd_mnist.yaml", tuple(overrides)) for name, overrides in LATTACK_SCHEDULES.items()],
        [
            ("attack/lattack/top1", "SCNN top-1"),
            ("attack/lattack/feature_cosine", "feature cos."),
            ("attack/lattack/feature_cosine_noise", "noise cos."),
            ("attack/lattack/fid", "FID"),
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
    "few_references": (
        [
            Row(
                "DS-FL, MNIST (200 a digit), 5 clients, round 1, 2 students a client",
                "conf/experiment/ldia_lira_dsfl_mnist.yaml",
                (
                    "data.max_per_class=200",
                    "protocol.num_clients=5",
                    "protocol.rounds=1",
                    "protocol.public_per_round=300",
                    "attacks=[lira_distill,rmia_distill]",
                    "attack.lira_distill.students=2",
                    "attack.rmia_distill.students=2",
                ),
            )
        ],
        [
            ("attack/lira_distill/auc", "distill. LiRA AUC"),
            ("attack/rmia_distill/auc", "distill. RMIA AUC"),
            ("attack/lira_distill/tpr_at_1pct_fpr", "LiRA TPR@1%"),
            ("attack/rmia_distill/tpr_at_1pct_fpr", "RMIA TPR@1%"),
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
        ("attack/pli/accuracy", "attack/pli/prior_accuracy", "PLI acc. − prior acc."),
        ("attack/ldia/kl", "attack/ldia/uniform_kl", "LDIA KL − uniform KL"),
    ],
    "pli": [
        ("attack/pli/accuracy", "attack/pli/prior_accuracy", "PLI acc. − prior acc."),
        ("attack/pli/accuracy", "attack/pli/chance", "PLI acc. − chance"),
        ("attack/tbi/accuracy", "attack/tbi/chance", "TBI acc. − chance"),
    ],
    "blur": [
        ("attack/pli/accuracy", "attack/pli/prior_accuracy", "PLI acc. − prior acc."),
        ("attack/pli/accuracy", "attack/pli/chance", "PLI acc. − chance"),
    ],
    "lattack_mnist": [("attack/lattack/feature_cosine", "attack/lattack/feature_cosine_noise", "feature cos. − noise cos.")],
    "defenses": [("attack/pli/accuracy", "attack/pli/chance", "PLI acc. − chance")],
    "few_references": [("attack/rmia_distill/auc", "attack/lira_distill/auc", "RMIA AUC − LiRA AUC")],
    "pdafd": [
        ("attack/ldia/kl", "attack/ldia/uniform_kl", "LDIA KL − uniform KL"),
        ("attack/ldia/kl", "attack/ldia/random_kl", "LDIA KL − random KL"),
    ],
}


def _evasion(seeds: list[int], root: Path, read_only: bool) -> list[str]:
    command = ["benchmarks/evasion_decoys.py", "--seeds", *map(str, seeds), "--root", str(root)]
    return [*command, "--existing"] if read_only else command


def _matrix(seeds: list[int], root: Path, read_only: bool) -> list[str]:
    """The small preset (its seeds are the file's; ``--decide`` adds seeds where a verdict waits on them)."""
    return ["fdattack", "matrix", "conf/matrix/small.yaml", "--jobs", "2", "--decide", "--root", str(root)]


def keep_matrix(root: Path, results: Path) -> None:
    """Copy the matrix's ``matrix.json`` (and ``seeds.json``) from its run root into the kept results."""
    kept = results / "matrix" / "small"
    kept.mkdir(parents=True, exist_ok=True)
    for name in ("matrix.json", "seeds.json"):
        if (root / name).is_file():
            shutil.copyfile(root / name, kept / name)


def print_matrix(path: Path) -> None:
    """The answer, the tables and the surviving comparisons of a ``matrix.json``."""
    matrix = json.loads(path.read_text())
    seeds = path.with_name("seeds.json")
    if seeds.is_file():
        print(decide_table(json.loads(seeds.read_text())))
    print(answer_table(matrix))
    print(matrix_tables(matrix))
    print(comparisons_summary(matrix["comparisons"]))


def decide_table(state: dict) -> str:
    """What ``--decide`` did (a root's ``seeds.json``): each look's verdict counts, minutes and why it went on or
    stopped, then each cell it extended with its seeds and why it holds them."""
    design = state["design"]
    out = [
        f"`--decide`: {design['looks']} looks planned (seeds {design['first']}, batches of {design['batch']} up to "
        f"{design['max_seeds']}, a budget of {design['budget_minutes']:g} minutes), each test at α = {design['alpha']:.3g}; "
        f"{state.get('minutes', 0):.0f} minutes spent.",
        "",
        "| look | minutes | undefended: leaks / stopped / undecided | defended: leaks / stopped / undecided | cells waiting | then |",
        "|---|---|---|---|---|---|",
    ]
    for look in state["looks"]:
        counts = ["{leaks} / {stopped} / {undecided}".format(**look["verdicts"][side]) for side in ("undefended", "defended")]
        out.append(f"| {look['look']} | {look['minutes']:.0f} | {counts[0]} | {counts[1]} | {len(look['waiting'])} | {look['why']} |")
    extended = {cell: entry for cell, entry in state["cells"].items() if len(entry["seeds"]) > len(design["first"])}
    out += ["", "| cell | seeds | why |", "|---|---|---|"]
    out += [f"| {cell} | {len(entry['seeds'])} | {entry.get('why', '')} |" for cell, entry in sorted(extended.items())]
    return "\n".join(out) + "\n"


#: figure sets measured by their own command: table -> (seeds, its root, read-only) -> the command
EXTERNAL = {"evasion": _evasion, "matrix": _matrix}

#: the matrix's tables in docs/matrix.md: (metric, title)
MATRIX_TABLES = [
    ("attack/pli/accuracy", "PLI accuracy (chance 0.05)"),
    ("attack/tbi/accuracy", "TBI accuracy (chance 0.05)"),
    ("attack/ldia/kl", "LDIA KL (lower leaks more; the uniform guess is in the answer table)"),
    ("attack/lira_distill/auc", "distillation LiRA AUC (chance 0.5)"),
    ("attack/rmia_distill/auc", "distillation RMIA AUC (chance 0.5)"),
    ("attack/lira_coop/auc", "co-op LiRA AUC (chance 0.5)"),
    ("attack/rmia_coop/auc", "co-op RMIA AUC (chance 0.5)"),
    ("attack/lattack/top1", "L-Attack top-1 (chance 0.1)"),
    ("attack/gmi/top1", "GMI top-1 (chance 0.2)"),
    ("attack/kedmi/top1", "KED-MI top-1 (chance 0.2)"),
    ("attack/vmi/top1", "VMI top-1 (chance 0.2)"),
    ("protocol/client_acc_mean", "client accuracy (distillation cells)"),
    ("protocol/server_acc", "server accuracy (FedMD's f_0, the FedGEMS and DS-FL server models, FedAvg's global model)"),
]


def answer_table(matrix: dict) -> str:
    """docs/matrix.md's answer: one sentence per attack, then per attack and place its undefended value, its control
    (the attacker's best without the protocol), the paired per-seed difference, the verdict, the cheapest setting shown
    to stop it and each defense's (:mod:`fdattack.matrix.answer`)."""
    rows = answers(matrix)
    by_attack: dict[str, list] = {}
    for a in rows:
        by_attack.setdefault(a.attack, []).append(a)
    out = [f"- {sentence(attack, found)}" for attack, found in by_attack.items()]
    out += [
        "",
        "| attack | data / protocol | undefended | control (from) | − control, paired by seed | δ | verdict | cheapest setting shown "
        "to stop it | per defense |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for a in rows:
        if a.decision.verdict is not Verdict.leaks:
            stop = "–"
        elif a.cheapest is None:
            stop = f"none shown of {a.tried}" if a.tried else "none measured"
        else:
            cost = "?" if a.cheapest.cost is None else f"{a.cheapest.cost:+.3g}"
            stop = f"{a.cheapest.defense}: {a.cheapest.value.text()} (accuracy cost {cost})"
        each = per_defense(a) if a.leaks else "–"
        control = f"{a.control.mean:.3g} ({', '.join(a.control.sources)})"
        verdict = f"**{WORDS[a.decision.verdict]}**" if a.leaks else WORDS[a.decision.verdict]
        out.append(
            f"| {a.attack} | {a.data} / {a.protocol} | {a.value.text()} | {control} | {difference_text(a.decision)} | "
            f"{a.decision.margin:.3g} | {verdict} | {stop} | {each} |"
        )
    return "\n".join(out) + "\n"


def matrix_tables(matrix: dict) -> str:
    """docs/matrix.md's tables from ``matrix.json``: per metric, a row per data/protocol that records it and a column per
    defense, each cell its mean [95 % interval of its kind across the seeds]."""
    defenses = matrix["axes"]["defenses"]
    by_id = {cell["id"]: cell for cell in matrix["cells"]}
    out = []
    for key, title in MATRIX_TABLES:
        pairs = [(d, p) for d in matrix["axes"]["data"] for p in matrix["axes"]["protocols"]]
        rows = [(d, p) for d, p in pairs if any(key in by_id.get(f"{d}/{p}/{f}", {}).get("metrics", {}) for f in defenses)]
        columns = [f for f in defenses if any(key in by_id.get(f"{d}/{p}/{f}", {}).get("metrics", {}) for d, p in rows)]
        if not rows:
            continue
        out += [f"**{title}**", "", "| data / protocol | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        for d, p in rows:
            cells = []
            for defense in columns:
                metric = by_id.get(f"{d}/{p}/{defense}", {}).get("metrics", {}).get(key)
                if metric is None:
                    cells.append("n/a")
                    continue
                low, high = metric.get("ci_low"), metric.get("ci_high")
                shown = f"{metric['mean']:.2f}"
                cells.append(shown if low is None or high is None or f"{low:.2f}" == f"{high:.2f}" else f"{shown} [{low:.2f}, {high:.2f}]")
            out.append(f"| {d} / {p} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


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


def cell(metrics: dict, values: dict[int, float], key: str) -> str:
    """``mean [low, high] (v0 / v1 / v2)``: the aggregate's mean and interval across the seeds, then each seed's value."""
    value, low, high = metrics.get(key), metrics.get(key + "_ci_low"), metrics.get(key + "_ci_high")
    if value is None or not math.isfinite(value):
        return "–"
    interval = (
        f" [{low:.3g}, {high:.3g}]" if low is not None and high is not None and math.isfinite(low) and f"{low:.3g}" != f"{high:.3g}" else ""
    )
    seeds = " / ".join(f"{values[s]:.3g}" for s in sorted(values))
    return f"{value:.3g}{interval} ({seeds})"


def paired(a: dict[int, float], b: dict[int, float]) -> Difference:
    """The paired difference a − b over the seeds both recorded."""
    seeds = sorted(set(a) & set(b))
    return paired_difference([a[s] for s in seeds], [b[s] for s in seeds])


def comparisons(results: list[tuple[Row, Path]], baselines: list[tuple[str, str, str]], columns: list[tuple[str, str]]) -> list[str]:
    """Every comparison the table makes, seed by seed: each row against its baselines, and every pair of rows of one
    group on every column; each with the mean difference, its t interval, the per-seed differences and whether it
    survives Holm's correction over all of them."""
    values = [(row, per_seed(folder)) for row, folder in results]
    made: list[tuple[str, dict[int, float], dict[int, float]]] = []
    for row, seeds in values:
        for key, baseline, title in baselines:
            if key in seeds and baseline in seeds:
                made.append((f"{row.name}, {title}", seeds[key], seeds[baseline]))
    for i, (a, seeds_a) in enumerate(values):
        for b, seeds_b in values[i + 1 :]:
            if a.group == b.group:
                made.extend(
                    (f"{a.name} − {b.name}, {title}", seeds_a[key], seeds_b[key])
                    for key, title in columns
                    if key in seeds_a and key in seeds_b
                )
    differences = [paired(x, y) for _, x, y in made]
    tested = [i for i, d in enumerate(differences) if math.isfinite(d.p_value)]
    adjusted = dict(zip(tested, holm_adjusted([differences[i].p_value for i in tested])))
    lines = [f"{len(tested)} comparisons tested, Holm's correction over them at a family-wise 0.05 (equal at every seed: no test):"]
    for i, ((title, x, y), d) in enumerate(zip(made, differences)):
        if d.n and d.low == d.high == 0:
            continue  # the same value in both rows at every seed (chance, a baseline): nothing to compare
        each = " / ".join(f"{x[s] - y[s]:+.3g}" for s in sorted(set(x) & set(y)))
        verdict = "equal at every seed"
        if i in adjusted:
            verdict = f"Holm p {adjusted[i]:.2g}, {'survives' if adjusted[i] <= 0.05 else 'within noise'}"
        lines.append(f"{title}: {d.mean:+.3g} [{d.low:+.3g}, {d.high:+.3g}] (per seed {each}; {verdict})")
    return lines


def run_external(table: str, seeds: list[int], root: Path, results: Path, read_only: bool) -> None:
    """A figure set measured by its own command: run it and keep what it measured (the matrix's ``matrix.json``), or,
    with ``read_only``, print what is kept."""
    if read_only:
        kept = results / "matrix" / "small" / "matrix.json"
        if table == "matrix" and kept.is_file():
            print(f"\n### matrix: kept in {kept.relative_to(REPO) if kept.is_relative_to(REPO) else kept}\n")
            print_matrix(kept)
        else:
            print(f"\n### {table}: nothing kept in {results}; `python benchmarks/headline_tables.py --tables {table}` measures it\n")
        return
    command = EXTERNAL[table](seeds, root / table, read_only)
    print(f"\n### {table}: `{' '.join(command)}`\n", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *command] if command[0].endswith(".py") else command, cwd=REPO, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{table}: {' '.join(command)} failed ({proc.returncode})")
    if table == "matrix":
        keep_matrix(root / table, results)


def keep_row(folder: Path, kept: Path) -> None:
    """Copy a row's aggregate (:data:`KEPT`) into the kept results."""
    kept.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        shutil.copyfile(folder / name, kept / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", nargs="+", default=[*TABLES, *EXTERNAL], choices=[*TABLES, *EXTERNAL])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "headline", help="where the runs go")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where what they measured is kept (and read with --read-only)")
    parser.add_argument("--override", nargs="*", default=[], help="overrides added to every run, e.g. trainer.accelerator=gpu")
    parser.add_argument("--read-only", action="store_true", help="print the tables kept under --results; run nothing")
    parser.add_argument("--print-matrix", type=Path, help="print the answer, tables and surviving comparisons of this matrix.json")
    args = parser.parse_args()
    if args.print_matrix:
        print_matrix(args.print_matrix)
        return
    for table in args.tables:
        if table in EXTERNAL:
            run_external(table, args.seeds, args.root, args.results, args.read_only)
            continue
        rows, columns = TABLES[table]
        kept = [(row, row_folder(row, args.results / "headline", table)) for row in rows]
        if not args.read_only:
            print(f"running table {table} ({len(rows)} rows x {len(args.seeds)} seeds)", file=sys.stderr)
            for row, keep in kept:
                run_row(row, args.seeds, row_folder(row, args.root, table), args.override)
                keep_row(row_folder(row, args.root, table), keep)
        missing = [row.name for row, folder in kept if not (folder / "metrics.json").is_file()]
        results = [(row, folder) for row, folder in kept if row.name not in missing]
        if not results:
            print(f"\n### {table}: nothing kept in {args.results}; `python benchmarks/headline_tables.py --tables {table}` measures it\n")
            continue
        read = {folder: per_seed(folder) for _, folder in results}
        seeds = sorted({seed for values in read.values() for by_seed in values.values() for seed in by_seed})  # as run
        print(f"\n### {table}: mean over seeds {', '.join(map(str, seeds))} [95 % interval across the seeds] (each seed)\n")
        print("| row | " + " | ".join(title for _, title in columns) + " |")
        print("|---|" + "---|" * len(columns))
        for row, folder in results:
            metrics = json.loads((folder / "metrics.json").read_text())
            print(f"| {row.name} | " + " | ".join(cell(metrics, read[folder].get(key, {}), key) for key, _ in columns) + " |")
        if missing:
            print(f"\nNothing kept yet under {args.results / 'headline' / table}: {', '.join(missing)}")
        print("\nSeed by seed (paired difference, 95 % t interval):")
        print("\n".join(f"- {line}" for line in comparisons(results, BASELINES[table], columns)))


if __name__ == "__main__":
    main()
