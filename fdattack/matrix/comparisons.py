"""Each defense against no defense, seed by seed: the matrix's paired comparisons and which of them survive.

Two cells of one (data, protocol) that differ only by their defense share each seed's split, initialisation and
public rounds, so their per-seed values are paired. For every such pair and every metric the page shows (each attack's
headline metrics and the clients' accuracy), the comparison is the paired difference defended − undefended over the
seeds both cells recorded (:func:`fdattack.statistics.paired.paired_difference`: mean, 95 % t interval, p-value of
the paired t test). A matrix makes many such comparisons at once, so which of them survive is decided by Holm's
step-down correction over all of them at the verdicts' α (5 %; α/K where ``--decide`` spent it over K looks: the
cells' seeds then depend on what earlier looks saw), and the family's size is printed beside the result.
The undefended cell is the defense whose overrides are empty (``none: []`` in the presets). Each seed's within-run
spread (both cells') floors the seeds' spread, so a difference that is the same at every seed (a rate at the same count)
is tested against the runs' own spread; one with no spread known at all (a metric no defense moves and nothing
measured within a run, such as the bytes) has no t test: it is listed in ``matrix.json`` but left out of the family.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fdattack.matrix.cell_result import CellResult
from fdattack.matrix.spec import CONTROL, MatrixSpec
from fdattack.statistics.across_seeds import seed_within
from fdattack.statistics.kinds import metric_range
from fdattack.statistics.paired import holm_adjusted, paired_difference
from fdattack.statistics.verdicts import ALPHA


@dataclass(frozen=True)
class DefenseComparison:
    """One defense against no defense in one (data, protocol) for one metric, over the seeds both cells recorded."""

    data: str
    protocol: str
    metric: str
    defense: str
    baseline: str
    seeds: list[int]
    baseline_values: list[float]
    values: list[float]
    mean: float
    ci_low: float
    ci_high: float
    p_value: float
    p_holm: float
    survives: bool


def baseline_defense(spec: MatrixSpec) -> str | None:
    """The undefended setting: the first defense with no overrides (never the control runs), or None where every
    setting defends."""
    return next((name for name, overrides in spec.defenses.items() if not overrides and name != CONTROL), None)


def _finite(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _per_seed(result: "CellResult", key: str) -> dict[int, float]:
    return {seed: _finite(final.get(key)) for seed, final in zip(result.seeds, result.per_seed)}


def _within(result: "CellResult", key: str) -> dict[int, float]:
    return {seed: seed_within(final, key) for seed, final in zip(result.seeds, result.per_seed)}


def defense_comparisons(spec: MatrixSpec, results: list["CellResult"], metrics: list[str], alpha: float = ALPHA) -> list[DefenseComparison]:
    """Every defended cell against the undefended cell of its (data, protocol), for each of ``metrics`` both recorded,
    with Holm's correction at family-wise level ``alpha`` (the verdicts' α) over those with a p-value (a comparison with
    fewer than two paired seeds, or whose per-seed differences are all equal, has none: it is listed, left out of the
    family and never survives); each interval at 1 − ``alpha``."""
    baseline = baseline_defense(spec)
    if baseline is None:
        return []
    done = {(r.cell.data, r.cell.protocol, r.cell.defense): r for r in results if r.status == "done"}
    rows: list[tuple[str, str, str, str, list[int], list[float], list[float]]] = []
    spreads: list[list[float]] = []  # per row, each seed's within-run variance of the difference
    for data in spec.data:
        for protocol in spec.protocols:
            reference = done.get((data, protocol, baseline))
            if reference is None:
                continue
            for defense in spec.defenses:
                defended = done.get((data, protocol, defense))
                if defense in (baseline, CONTROL) or defended is None:
                    continue
                for metric in metrics:
                    a, b = _per_seed(defended, metric), _per_seed(reference, metric)
                    seeds = [s for s in defended.seeds if math.isfinite(a.get(s, math.nan)) and math.isfinite(b.get(s, math.nan))]
                    if seeds:
                        rows.append((data, protocol, metric, defense, seeds, [b[s] for s in seeds], [a[s] for s in seeds]))
                        wa, wb = _within(defended, metric), _within(reference, metric)
                        spreads.append([wa.get(s, math.nan) + wb.get(s, math.nan) for s in seeds])
    differences = [
        paired_difference(values, reference, 1 - alpha, within=w, bounds=metric_range(metric))
        for (_, _, metric, *_, reference, values), w in zip(rows, spreads)
    ]
    tested = [i for i, d in enumerate(differences) if math.isfinite(d.p_value)]
    holm = dict(zip(tested, holm_adjusted([differences[i].p_value for i in tested])))
    adjusted = [holm.get(i, math.nan) for i in range(len(rows))]
    return [
        DefenseComparison(
            data, protocol, metric, defense, baseline, seeds, reference, values, d.mean, d.low, d.high, d.p_value, p, p <= alpha
        )
        for (data, protocol, metric, defense, seeds, reference, values), d, p in zip(rows, differences, adjusted)
    ]


def comparisons_json(comparisons: list[DefenseComparison], alpha: float = ALPHA) -> dict:
    """``matrix.json``'s ``comparisons``: the family's size (the comparisons tested) and level, and every comparison."""
    tested = sum(math.isfinite(c.p_value) for c in comparisons)
    return {"family_size": tested, "alpha": alpha, "rows": [asdict(c) for c in comparisons]}


def comparison_line(row: dict) -> str:
    """A ``matrix.json`` comparison in one line: where, the metric, the difference with its interval, each seed's two
    values and the Holm-adjusted p-value."""
    seeds = ", ".join(f"{s}: {b:.3g} → {v:.3g}" for s, b, v in zip(row["seeds"], row["baseline_values"], row["values"]))
    return (
        f"{row['data']}/{row['protocol']} {row['metric']}: {row['defense']} − {row['baseline']} {row['mean']:+.3g} "
        f"[{row['ci_low']:+.3g}, {row['ci_high']:+.3g}] (seed {seeds}; Holm p {row['p_holm']:.2g})"
    )


def comparisons_summary(comparisons: dict) -> str:
    """The surviving comparisons of ``matrix.json``'s ``comparisons``, a line each, under the family's size."""
    rows = comparisons["rows"]
    surviving = [comparison_line(r) for r in rows if r["survives"]]
    head = (
        f"against no defense, seed by seed: {len(surviving)} of {comparisons['family_size']} paired differences survive Holm's "
        f"correction at {comparisons['alpha']:g}"
    )
    return "\n".join([head + (":" if surviving else ""), *(f"  {line}" for line in surviving)])
