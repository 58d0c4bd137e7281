"""What ``fdattack report`` compares: run directories, their labels and their metrics laid out by section.

A run's label names the config keys in which the compared runs differ (``tau=3, gamma=0.1``,
``protocol=dsfl``), so sweep trials read by their parameters, not ``trial_000``. Runs that differ only by their
``seed`` are one entry, the mean over the seeds with its 95 % interval across them (:func:`group_seeds`). Metrics are grouped
into sections by their prefix (``attack/pli``, ``protocol``, ``diag/confidence_gap``, ...); within a
section a metric recorded in several rounds is plotted against the round, one recorded in a single
round while the section goes on (PLI's ``prior_*`` scores) is "one-off", and the rest is tabled.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdattack.statistics.across_seeds import SEED_STD, SEEDS_KEY
from fdattack.statistics.intervals import is_interval_key
from fdattack.tracking.run_records import Run, load_run
from fdattack.tracking.seed_aggregate import aggregate_metrics, aggregate_rounds
from fdattack.tracking.summary import CHANCE

#: Config keys that never make runs different (where and under which name they ran).
IGNORED_KEYS = ("output_dir", "name", "resume")
IGNORED_PREFIXES = ("logger.",)
#: At most this many differing keys in a label (the runs table lists them all).
LABEL_KEYS = 4
_ABSENT = "–"


def format_value(value: Any) -> str:
    """A config value as a label shows it: ``0.1``, ``dsfl``, ``[pli, tbi]``, ``null``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return "null" if value is None else str(value)


def differing_keys(runs: list[Run]) -> list[str]:
    """Config keys whose values differ across ``runs`` (absent counts as a value), in config order."""
    keys = list(dict.fromkeys(key for run in runs for key in run.config))
    keys = [k for k in keys if k not in IGNORED_KEYS and not k.startswith(IGNORED_PREFIXES)]
    return [k for k in keys if len({format_value(run.config.get(k, _ABSENT)) for run in runs}) > 1]


def short_names(keys: list[str]) -> dict[str, str]:
    """The shortest unique dotted suffix of each key, ``x.name`` read as ``x``: ``attack.pli.tau`` -> ``tau``,
    ``protocol.name`` -> ``protocol``; ``pli.tau`` and ``tbi.tau`` when both differ."""
    parts = {k: k.split(".")[:-1] if k.endswith(".name") else k.split(".") for k in keys}
    depth = dict.fromkeys(keys, 1)
    while True:
        names = {k: ".".join(parts[k][-depth[k] :]) for k in keys}
        taken = list(names.values())
        clashing = [k for k in keys if taken.count(names[k]) > 1 and depth[k] < len(parts[k])]
        if not clashing:
            return names
        for k in clashing:
            depth[k] += 1


def label_keys(keys: list[str]) -> list[str]:
    """The differing keys a label shows: component choices (``protocol.name``) first, then the rest, less the
    settings of a component that itself differs (a DS-FL run has no ``protocol.digest_epochs`` to compare)."""
    chosen = [k for k in keys if k.endswith(".name")]
    implied = tuple(k[: -len("name")] for k in chosen)
    return chosen + [k for k in keys if k not in chosen and not k.startswith(implied)]


def _identity(run: Run) -> str:
    """The run's config less its seed and the keys that never make runs different."""
    kept = {
        k: format_value(v) for k, v in run.config.items() if k != "seed" and k not in IGNORED_KEYS and not k.startswith(IGNORED_PREFIXES)
    }
    return json.dumps(kept, sort_keys=True)


def group_seeds(runs: list[Run]) -> list[Run]:
    """Runs whose configs differ only by ``seed`` (each seed once) become one run, in the place of the first: its rounds and final
    metrics are the mean over the seeds, each with ``_seed_std`` and its 95 % interval across the seeds
    (:mod:`fdattack.tracking.seed_aggregate`), its ``seed`` the list of seeds, its grids the first seed's."""
    keys = [_identity(run) if run.config else f"#{i}" for i, run in enumerate(runs)]
    groups: dict[str, list[Run]] = {}
    for key, run in zip(keys, runs):
        groups.setdefault(key, []).append(run)
    out: list[Run] = []
    for key, run in zip(keys, runs):
        members = groups[key]
        seeds = [m.config.get("seed") for m in members]
        if len(members) == 1 or None in seeds or len(set(seeds)) < len(seeds):  # alone, or twins: not seed replicas
            out.append(run)
        elif run is members[0]:
            config = {**run.config, "seed": seeds}
            out.append(
                Run(
                    run.path,
                    config,
                    aggregate_rounds([m.rounds for m in members]),
                    aggregate_metrics([m.final for m in members]),
                    replicas=[m.path for m in members],
                    finished=all(m.finished for m in members),
                )
            )
    return out


def load_runs(paths: list[Path]) -> tuple[list[Run], list[str]]:
    """The runs, replicas that differ only by seed grouped into one (:func:`group_seeds`), labeled by the config
    keys in which they differ (see :func:`label_keys`), and those keys.

    Runs that differ in no key are labeled by their ``name`` (or directory); a label shared by two
    runs gets the directory name appended; a run over several seeds says how many.
    """
    runs = group_seeds([load_run(path) for path in paths])
    keys = differing_keys(runs)
    shown = label_keys(keys)
    names = short_names(shown)
    for run in runs:
        parts = [f"{names[k]}={format_value(run.config.get(k, _ABSENT))}" for k in shown[:LABEL_KEYS]]
        run.label = ", ".join(parts) + (", …" if len(shown) > LABEL_KEYS else "") if parts else str(run.config.get("name", run.path.name))
        seeds = len(run.replicas) or run.final.get(SEEDS_KEY)
        if seeds is not None and math.isfinite(seeds):  # a record over several seeds says how many
            run.label += f" ({int(seeds)} seeds)"
    labels = [run.label for run in runs]
    for i, run in enumerate(runs):
        if labels.count(run.label) > 1:
            run.label = (
                f"{run.label} ({run.path.name})" if [r.path.name for r in runs].count(run.path.name) == 1 else f"{run.label} (#{i + 1})"
            )
    return runs, keys


def split_key(key: str) -> tuple[str, str]:
    """``attack/pli/accuracy`` -> (``attack/pli``, ``accuracy``); a key without ``/`` is in section ``other``."""
    section, _, metric = key.rpartition("/")
    return section or "other", metric


@dataclass
class Section:
    """The metrics of one prefix across the runs.

    Attributes:
        name: ``attack/pli``, ``protocol``, ...
        per_round: metrics recorded in two rounds or more by some run (plotted), chance aside.
        one_off: metrics recorded in exactly one round by every run that has them, in a section that
            goes on for more rounds (tabled with their round).
        final: the other metrics, last values (the final table, with ``per_round``).
    """

    name: str
    per_round: list[str] = field(default_factory=list)
    one_off: list[str] = field(default_factory=list)
    final: list[str] = field(default_factory=list)

    @property
    def attack(self) -> str | None:
        """The attack's name for an ``attack/<name>`` section."""
        kind, _, name = self.name.partition("/")
        return name if kind == "attack" and name and "/" not in name else None

    def key(self, metric: str) -> str:
        return metric if self.name == "other" else f"{self.name}/{metric}"


def sections(runs: list[Run]) -> list[Section]:
    """The sections of every metric the runs recorded: attacks first, then ``protocol``, then the rest."""
    by_section: dict[str, set[str]] = {}
    for run in runs:
        for key in run.final:
            if is_interval_key(key) or key.endswith(SEED_STD) or key == SEEDS_KEY:
                continue  # drawn as a band and written beside its metric
            section, metric = split_key(key)
            by_section.setdefault(section, set()).add(metric)
    out = []
    for name, metrics in by_section.items():
        section = Section(name)
        counts = {m: max(len(run.series(section.key(m))) for run in runs) for m in metrics}
        section_rounds = max(len({row["round"] for row in run.rounds if any(section.key(m) in row for m in metrics)}) for run in runs)
        for metric in sorted(metrics):
            if counts[metric] >= 2 and metric not in CHANCE.values():  # chance levels are lines on the accuracy plots
                section.per_round.append(metric)
            elif counts[metric] == 1 and section_rounds >= 2:
                section.one_off.append(metric)
            else:
                section.final.append(metric)
        out.append(section)
    order = {"attack": 0, "protocol": 1}
    return sorted(out, key=lambda s: (order.get(s.name.split("/")[0], 2), s.name))
