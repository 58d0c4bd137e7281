"""Replicas of one run that differ only by their seed, summed up per round and at the end
(:mod:`fdattack.statistics.across_seeds` holds the statistics), and the seeds' table.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence

from fdattack.statistics.across_seeds import SEED_STD, SEEDS_KEY, across_seeds, is_number
from fdattack.statistics.intervals import is_interval_key
from fdattack.tracking.stopped_attacks import stopped_in_any, without_scores_of


def aggregate_metrics(replicas: Sequence[dict[str, object]]) -> dict[str, float]:
    """:func:`~fdattack.statistics.across_seeds.across_seeds` of ``replicas`` (one flat metrics dict per seed), where an
    attack stopped at any seed has no score at any (:mod:`~fdattack.tracking.stopped_attacks`): a mean over the seeds
    it finished would be another experiment's."""
    stopped = stopped_in_any(replicas)
    return across_seeds([without_scores_of(replica, stopped) for replica in replicas])


def aggregate_rounds(replicas: Sequence[list[dict[str, object]]]) -> list[dict[str, float]]:
    """One aggregate row per round that any replica recorded (``rounds.jsonl`` rows, each with ``round``), each over the
    replicas that recorded that round."""
    by_round: dict[int, list[dict[str, object]]] = {}
    for rows in replicas:
        for row in rows:
            by_round.setdefault(int(row["round"]), []).append({k: v for k, v in row.items() if k != "round"})  # type: ignore[arg-type]
    return [{"round": float(r), **aggregate_metrics(rows)} for r, rows in sorted(by_round.items())]


def seeds_table(seeds: Sequence[int], replicas: Sequence[dict[str, object]], aggregate: dict[str, float]) -> str:
    """CSV with a row per metric: its mean, standard deviation, 95 % interval across the seeds and each seed's value."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["metric", "mean", "std", "ci_low", "ci_high", *(f"seed_{s}" for s in seeds)])
    for key in sorted(k for k in aggregate if not is_interval_key(k) and not k.endswith(SEED_STD) and k != SEEDS_KEY):
        cells = [
            aggregate[key],
            aggregate.get(key + SEED_STD, math.nan),
            *(aggregate.get(key + end, math.nan) for end in ("_ci_low", "_ci_high")),
        ]
        per_seed = [r.get(key) for r in replicas]
        writer.writerow(
            [key, *(f"{v:.6g}" for v in cells), *("" if v is None else f"{float(v):.6g}" if is_number(v) else v for v in per_seed)]
        )
    return buffer.getvalue()
