"""One cell's outcome across its seeds (:class:`CellResult`): what the matrix's outputs
(:mod:`fdattack.matrix.outputs`) and its comparisons (:mod:`fdattack.matrix.comparisons`) both read."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fdattack.matrix.plan import Cell
from fdattack.statistics.across_seeds import SEED_STD, seed_within
from fdattack.statistics.intervals import HIGH, LOW

#: metrics of no use across cells: wall time depends on the machine and the load
LEFT_OUT = ("time/",)


@dataclass
class CellResult:
    """A cell's outcome: ``status`` is ``done`` (every seed finished), ``n/a`` (no simulation applies), ``failed`` (a
    seed failed: ``reason``) or ``incomplete`` (seeds left to run, e.g. while W&B agents work through the cells).
    ``stopped``: attack -> why, for each attack that a seed of a done cell stopped: it has no score there (its metrics
    NaN at every seed) and its seeds run again at the next invocation."""

    cell: Cell
    status: str
    reason: str | None = None
    seeds: list[int] = field(default_factory=list)
    per_seed: list[dict[str, float]] = field(default_factory=list)
    aggregate: dict[str, float] = field(default_factory=dict)
    images: dict[str, list[str]] = field(default_factory=dict)  # attack -> its last image per seed, relative to the root
    stopped: dict[str, str] = field(default_factory=dict)

    def metric(self, key: str) -> dict[str, Any] | None:
        """``{"mean", "ci_low", "ci_high", "seed_std", "values", "within"}`` of ``key``, or None where no seed recorded
        it; ``within`` holds each seed's within-run variance (:func:`~fdattack.statistics.across_seeds.seed_within`;
        None where it has none)."""
        if key not in self.aggregate:
            return None
        within = [seed_within(final, key) for final in self.per_seed]
        return {
            "mean": self.aggregate[key],
            "ci_low": self.aggregate.get(key + LOW),
            "ci_high": self.aggregate.get(key + HIGH),
            "seed_std": self.aggregate.get(key + SEED_STD),
            "values": [final.get(key) for final in self.per_seed],
            "within": [v if math.isfinite(v) else None for v in within],
        }

    def metric_keys(self) -> list[str]:
        """The cell's metrics (each once, without their interval and spread keys), in recorded order."""
        suffixes = (LOW, HIGH, SEED_STD)
        return [k for k in self.aggregate if not k.endswith(suffixes) and "/" in k and not k.startswith(LEFT_OUT) and k != "seeds/count"]
