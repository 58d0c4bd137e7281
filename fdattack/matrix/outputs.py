"""The matrix's results: ``matrix.json`` (the cells, what ran in each and why not, every metric's mean and 95 %
interval across the seeds), ``matrix.csv`` (one row per cell and metric) and the table printed at the end.

Across seeds a metric's interval is the one that fits its kind (:mod:`fdattack.statistics.across_seeds`: a
Wilson-type interval for rates, Student's t joined with a log-scale one for distances, Student's t otherwise), each
seed's own within-run spread a floor under the seeds' (``within`` in ``matrix.json``). ``comparisons`` holds each
defense against no defense, seed by seed
(:mod:`fdattack.matrix.comparisons`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from fdattack.matrix.cell_result import CellResult
from fdattack.matrix.comparisons import baseline_defense, comparisons_json, defense_comparisons
from fdattack.matrix.decide import SeedState
from fdattack.matrix.spec import MatrixSpec
from fdattack.statistics.verdicts import ALPHA
from fdattack.tracking import atomic_write, to_jsonable

#: the attack metrics shown per attack (where it records them): its success and its distance to the truth
HEADLINE = ("accuracy", "eval_top1", "top1", "kl", "auc", "tpr_at_1pct_fpr")
#: the utility beside the leakage: every client's accuracy on the pooled test set, the server's, and the bytes
UTILITY = ("protocol/client_acc_mean", "protocol/server_acc", "comm/upload_bytes", "comm/download_bytes")
#: the defenses' own budgets (ε of DP-SGD)
BUDGETS = ("defense/dpsgd/epsilon",)
CSV_COLUMNS = ("data", "protocol", "defense", "metric", "mean", "ci_low", "ci_high", "seed_std", "seeds", "values", "status", "reason")


def headline_metrics(results: list[CellResult], attack: str) -> list[str]:
    """The :data:`HEADLINE` metrics that ``attack`` recorded in any cell, as ``attack/<name>/<metric>`` keys."""
    keys = {key for r in results for key in r.aggregate}
    return [f"attack/{attack}/{m}" for m in HEADLINE if f"attack/{attack}/{m}" in keys]


def compared_metrics(spec: MatrixSpec, results: list[CellResult]) -> list[str]:
    """The metrics each defense is compared on with no defense: every attack's headline metrics and the clients' accuracy."""
    return [key for attack in spec.attacks for key in headline_metrics(results, attack)] + [UTILITY[0]]


def to_json(spec: MatrixSpec, results: list[CellResult], seeds: SeedState | None = None) -> dict[str, Any]:
    """The content of ``matrix.json``; ``seeds``: what ``--decide`` did to the root (its design sets the α of the verdicts
    and of the comparisons)."""
    alpha = ALPHA if seeds is None else seeds.design.alpha
    return {
        "name": spec.name,
        "source": str(spec.source),
        "seeds": list(spec.seeds),
        "axes": {
            "data": list(spec.data),
            "protocols": list(spec.protocols),
            "defenses": list(spec.defenses),
            "attacks": list(spec.attacks),
        },
        "undefended": baseline_defense(spec),
        "control": {data: list(overrides) for data, overrides in spec.control.items()},
        "margins": dict(spec.margins),
        "alpha": alpha,
        "decide": None if seeds is None else seeds.to_json(),
        "curves": {name: {"key": c.key, "settings": [list(point) for point in c.settings]} for name, c in spec.curves.items()},
        "headline": {attack: headline_metrics(results, attack) for attack in spec.attacks},
        "utility": [k for k in (*UTILITY, *BUDGETS) if any(k in r.aggregate for r in results)],
        "comparisons": comparisons_json(defense_comparisons(spec, results, compared_metrics(spec, results), alpha), alpha),
        "cells": [
            {
                "id": r.cell.id,
                "data": r.cell.data,
                "protocol": r.cell.protocol,
                "defense": r.cell.defense,
                "status": r.status,
                "reason": r.reason,
                "attacks": list(r.cell.attacks),
                "not_applicable": r.cell.not_applicable,
                "stopped": r.stopped,
                "seeds": r.seeds,
                "metrics": {key: r.metric(key) for key in r.metric_keys()},
                "images": r.images,
            }
            for r in results
        ],
    }


def _number(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.6g}"


def to_csv(results: list[CellResult]) -> str:
    """The content of ``matrix.csv``: a row per cell and metric; an n/a attack or cell is a row with its reason."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in results:
        where = (r.cell.data, r.cell.protocol, r.cell.defense)
        if r.status != "done":
            writer.writerow([*where, "", "", "", "", "", "", "", r.status, r.reason or ""])
        for attack, reason in r.cell.not_applicable.items():
            writer.writerow([*where, f"attack/{attack}", "", "", "", "", "", "", "n/a", reason])
        for attack, why in r.stopped.items():
            writer.writerow([*where, f"attack/{attack}", "", "", "", "", "", "", "stopped", why])
        for key in r.metric_keys():
            m = r.metric(key)
            assert m is not None
            values = ";".join(_number(v) for v in m["values"])
            row = [_number(m["mean"]), _number(m["ci_low"]), _number(m["ci_high"]), _number(m["seed_std"])]
            writer.writerow([*where, key, *row, len(r.seeds), values, r.status, ""])
    return buffer.getvalue()


def write_outputs(root: Path, spec: MatrixSpec, results: list[CellResult], seeds: SeedState | None = None) -> bool:
    """Write ``matrix.json`` and ``matrix.csv`` into ``root`` (each whole or not at all); whether ``matrix.json`` changed
    (False when an earlier call wrote the same matrix)."""
    root.mkdir(parents=True, exist_ok=True)
    text = json.dumps(to_jsonable(to_json(spec, results, seeds)), indent=2, allow_nan=False) + "\n"
    path = root / "matrix.json"
    changed = not path.is_file() or path.read_text() != text
    atomic_write(path, lambda handle: handle.write(text.encode()))
    table = to_csv(results)
    atomic_write(root / "matrix.csv", lambda handle: handle.write(table.encode()))
    return changed


def _shown(result: CellResult, key: str) -> str:
    if result.status != "done":
        return result.status
    if key.startswith("attack/") and key.split("/")[1] in result.stopped:
        return "stopped"
    m = result.metric(key)
    if m is None:
        attack = key.split("/")[1]
        return "n/a" if attack in result.cell.not_applicable else "-"
    low, high = m["ci_low"], m["ci_high"]
    interval = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None and math.isfinite(low) and math.isfinite(high) else ""
    return f"{m['mean']:.2f}{interval}"


def summary_table(spec: MatrixSpec, results: list[CellResult]) -> str:
    """Per attack its first headline metric, then the clients' accuracy: a table each (rows: data/protocol, columns:
    defenses) of mean [95 % interval across the seeds]."""
    keys = [metrics[0] for metrics in (headline_metrics(results, a) for a in spec.attacks) if metrics] + list(UTILITY[:1])
    by_place = {(r.cell.data, r.cell.protocol, r.cell.defense): r for r in results}
    blocks = []
    for key in keys:
        header = ["data/protocol", *spec.defenses]
        rows = [
            [f"{data}/{protocol}", *(_shown(by_place[data, protocol, defense], key) for defense in spec.defenses)]
            for data in spec.data
            for protocol in spec.protocols
        ]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in [header, *rows]]
        blocks.append(f"{key}:\n" + "\n".join(lines))
    return "\n\n".join(blocks)
