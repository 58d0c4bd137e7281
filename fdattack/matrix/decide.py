"""Seeds until decided: ``fdattack matrix FILE --decide`` adds seeds, a batch at a time, to the cells whose verdict is
undecided (:mod:`fdattack.matrix.answer`), until each is decided, has ``max_seeds``, or the time budget is
spent.

The design is fixed before the first simulation, from the matrix file's ``decide:`` (:class:`Design`): the first look
at the file's seeds, then a look after each batch, K looks in all. Each look tests at α/K (Bonferroni's spending of
α over the looks, :func:`fdattack.statistics.verdicts.look_alpha`), so the chance of any false verdict about a cell
stays at most α whichever look it stops at: stopping a cell as soon as it is decided is then no bias. The verdicts of
the whole matrix, whichever look they come from, are read at α/K, and a plain ``fdattack matrix`` run on a root that
``--decide`` extended reads them so too.

The budget bounds the run, not only its start: a batch is given only to the cells whose simulations are expected to
end within it (each cell's mean seconds a simulation so far, ``time/total_s``, times the batch, over the jobs; the
cheapest cells first), and the minutes count over every invocation on the root, so a stopped and resumed run spends
one budget.

``<root>/seeds.json`` keeps the design, each extended cell's seeds and why it stopped, the minutes spent, and one line
per look (its seeds, the verdicts it counted, the minutes so far); the page and ``matrix.json`` show them.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fdattack.errors import ConfigError
from fdattack.matrix.answer import CONTROL, Answer
from fdattack.statistics.verdicts import ALPHA, Verdict, look_alpha
from fdattack.tracking import atomic_write

#: the file of a root's extended seeds
SEEDS_FILE = "seeds.json"
#: a simulation's own wall time, in every replica's final metrics
SECONDS_KEY = "time/total_s"


@dataclass(frozen=True)
class Design:
    """The sequential design: the first seeds, the most seeds a cell may get, seeds added per look, and the minutes
    after which no batch starts."""

    first: tuple[int, ...]
    max_seeds: int = 10
    batch: int = 2
    budget_minutes: float = 120.0

    @property
    def looks(self) -> int:
        """K: the first look, then one per batch up to ``max_seeds``."""
        return 1 + math.ceil(max(0, self.max_seeds - len(self.first)) / self.batch)

    @property
    def alpha(self) -> float:
        """The error rate of each test at each look."""
        return look_alpha(ALPHA, self.looks)

    def next_seeds(self, seeds: list[int]) -> list[int]:
        """``seeds`` with the next batch added (new seeds count on from the largest of the first), at most ``max_seeds``."""
        start = max(max(self.first), *seeds) + 1
        room = max(0, self.max_seeds - len(seeds))
        return [*seeds, *range(start, start + min(self.batch, room))]


def design_of(spec_seeds: tuple[int, ...], raw: Any, where: str) -> Design:
    """The matrix file's ``decide:`` (``{max_seeds, batch, budget_minutes}``, each optional) checked.

    Raises:
        ConfigError: one line naming the key and what it allows.
    """
    if raw is None:
        return Design(spec_seeds)
    if not isinstance(raw, dict) or set(raw) - {"max_seeds", "batch", "budget_minutes"}:
        raise ConfigError(f"{where}: decide takes max_seeds, batch and budget_minutes, got {raw!r}")
    design = Design(spec_seeds, **raw)
    if not isinstance(design.max_seeds, int) or design.max_seeds < len(spec_seeds):
        raise ConfigError(f"{where}: decide.max_seeds={design.max_seeds!r} must be an integer ≥ the {len(spec_seeds)} seeds given")
    if not isinstance(design.batch, int) or design.batch < 1:
        raise ConfigError(f"{where}: decide.batch={design.batch!r} must be a positive integer")
    if not isinstance(design.budget_minutes, (int, float)) or not design.budget_minutes > 0:
        raise ConfigError(f"{where}: decide.budget_minutes={design.budget_minutes!r} must be a positive number")
    return design


@dataclass
class SeedState:
    """What ``--decide`` did to a root: the design, each extended cell's seeds and why it stopped, one entry per look."""

    design: Design
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)  # cell id -> {"seeds": [...], "why": "..."}
    looks: list[dict[str, Any]] = field(default_factory=list)
    minutes: float = 0.0  # spent by every invocation on the root so far

    def seeds_of(self, cell_id: str) -> list[int]:
        return list(self.cells.get(cell_id, {}).get("seeds") or self.design.first)

    def to_json(self) -> dict[str, Any]:
        return {
            "design": {**asdict(self.design), "first": list(self.design.first), "looks": self.design.looks, "alpha": self.design.alpha},
            "cells": self.cells,
            "looks": self.looks,
            "minutes": round(self.minutes, 2),
        }


def load_state(root: Path, design: Design) -> SeedState | None:
    """The root's ``seeds.json`` (None where ``--decide`` never ran there).

    Raises:
        ConfigError: the file is unreadable, or its design is not ``design`` (the looks' α was spent on another plan).
    """
    path = root / SEEDS_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        saved = raw["design"]
        state = SeedState(
            Design(tuple(saved["first"]), saved["max_seeds"], saved["batch"], saved["budget_minutes"]),
            raw["cells"],
            raw["looks"],
            float(raw.get("minutes", raw["looks"][-1]["minutes"] if raw["looks"] else 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path} cannot be read ({err}); delete it to forget the extended seeds") from None
    if (state.design.first, state.design.max_seeds, state.design.batch) != (design.first, design.max_seeds, design.batch):
        raise ConfigError(
            f"{path} was made with decide {asdict(state.design)}, the matrix file now gives {asdict(design)}: the looks' α was "
            "spent on that plan; use the file's decide: as it was, or another --root"
        )
    return state


def save_state(root: Path, state: SeedState) -> None:
    text = json.dumps(state.to_json(), indent=2) + "\n"
    atomic_write(root / SEEDS_FILE, lambda handle: handle.write(text.encode()))


def cells_to_extend(rows: list[Answer], undefended: str, cells: set[str]) -> set[str]:
    """The ids of the cells a verdict waits on: the undefended cell of each undecided attack, each undecided defense
    setting where the attack leaks or is undecided undefended, and the control run of each such place (``cells``: the
    ids that exist)."""
    wanted: set[tuple[str, str, str]] = set()
    for a in rows:
        if a.decision.verdict is Verdict.undecided:
            wanted.add((a.data, a.protocol, undefended))
        if a.decision.verdict in (Verdict.leaks, Verdict.undecided):
            wanted |= {(a.data, a.protocol, s.defense) for s in a.settings if s.decision.verdict is Verdict.undecided}
    wanted |= {(data, protocol, CONTROL) for data, protocol, _ in wanted}
    return {"/".join(place) for place in wanted} & cells


def verdict_counts(rows: list[Answer]) -> dict[str, dict[str, int]]:
    """How many undefended places and defended settings stand at each verdict."""
    undefended = {v.value: sum(a.decision.verdict is v for a in rows) for v in Verdict}
    defended = {v.value: sum(s.decision.verdict is v for a in rows for s in a.settings) for v in Verdict}
    return {"undefended": undefended, "defended": defended}


def affordable(costs: dict[str, float], minutes_left: float, jobs: int) -> list[str]:
    """The cells whose next batch fits in ``minutes_left`` (``costs``: cell id -> its batch's minutes of simulation),
    place by place (a place's cells, its control run among them, are paired seed by seed, so they get seeds together),
    cheapest place first: the chosen cells' summed cost over ``jobs``, and the longest one's, each within it."""
    places: dict[str, list[str]] = {}
    for cell_id in costs:
        places.setdefault(cell_id.rsplit("/", 1)[0], []).append(cell_id)
    chosen: list[str] = []
    total, longest = 0.0, 0.0
    for place in sorted(places, key=lambda p: (sum(costs[c] for c in places[p]), p)):
        cost, peak = sum(costs[c] for c in places[place]), max(costs[c] for c in places[place])
        if max((total + cost) / jobs, longest, peak) > minutes_left:
            break
        chosen += places[place]
        total, longest = total + cost, max(longest, peak)
    return sorted(chosen)


def batch_minutes(per_seed: list[dict[str, float]], batch: int) -> float:
    """A cell's next batch in minutes: ``batch`` times its simulations' mean wall time so far (0 where none recorded it)."""
    seconds = [final[SECONDS_KEY] for final in per_seed if math.isfinite(final.get(SECONDS_KEY, math.nan))]
    return batch * (sum(seconds) / len(seconds)) / 60 if seconds else 0.0
