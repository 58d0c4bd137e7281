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
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from fdattack.errors import DataError
from fdattack.statistics.across_seeds import SEED_STD, SEEDS_KEY
from fdattack.statistics.intervals import is_interval_key
from fdattack.tracking.seed_aggregate import aggregate_metrics, aggregate_rounds
from fdattack.tracking.stopped_attacks import without_stopped_scores
from fdattack.tracking.summary import CHANCE

#: Config keys that never make runs different (where and under which name they ran).
IGNORED_KEYS = ("output_dir", "name", "resume")
IGNORED_PREFIXES = ("logger.",)
#: At most this many differing keys in a label (the runs table lists them all).
LABEL_KEYS = 4
_ABSENT = "–"
ROUND_RECORD = 'a line is one round\'s record, {"round": N, "<metric>": number or null, ...}'
METRICS_RECORD = 'metrics.json is one object, {"<metric>": number or null, ...}'

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One run directory.

    Attributes:
        path: the directory.
        config: its ``config.yaml`` flattened to dotted keys (empty without one).
        rounds: the rows of ``rounds.jsonl`` (NaN is recorded as None).
        final: each metric's last recorded value, overridden by ``metrics.json``.
        label: the differing config keys (set by :func:`load_runs`).
        replicas: the run directories of the seeds behind a run that is their mean (:func:`group_seeds`); empty for one run.
        finished: whether the run (every replica) ran to its end (``metrics.json``): else ``final`` holds the last recorded
            values, which are not its results.
    """

    path: Path
    config: dict[str, Any]
    rounds: list[dict[str, Any]]
    final: dict[str, Any]
    label: str = ""
    replicas: list[Path] = field(default_factory=list)
    finished: bool = True

    @property
    def last_round(self) -> int | None:
        return max((int(row["round"]) for row in self.rounds), default=None)

    def series(self, key: str) -> list[tuple[int, float]]:
        """(round, value) of every round that recorded ``key`` (NaN where it recorded None)."""
        return [(int(row["round"]), _number(row[key])) for row in self.rounds if key in row]


def _number(value: Any) -> float:
    return float("nan") if value is None else float(value)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists are values."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}": value})
    return flat


def _json_kind(value: Any) -> str:
    """What a JSON value is (``list``, ``string``, ...), for an error message."""
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "list", str: "string", type(None): "null"}.get(type(value), "number")


def _shown(value: Any) -> str:
    """A JSON value as written in the file, cut to 60 characters."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_metrics(where: str, metrics: dict[str, Any]) -> None:
    """Every value of ``metrics`` is a number or None (NaN is recorded as null).

    Raises:
        DataError: naming ``where``, the key and its value.
    """
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, type(None))):
            raise DataError(f'{where}: "{key}" is {_shown(value)}; a metric is a number or null (NaN)')


def _read_text(path: Path) -> str:
    """The text of a run file (bytes that are not UTF-8 replaced, so that the JSON reader names their line).

    Raises:
        DataError: the file cannot be read.
    """
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise DataError(f"{path}: cannot read it ({err.strerror or err})") from None


def read_rounds(path: Path) -> list[dict[str, Any]]:
    """The rows of ``rounds.jsonl``: a JSON object per line with an integer ``round`` >= 0 and numbers or nulls.

    A last line that is not JSON and ends without a newline is a round's record torn by a run killed while writing it:
    it is skipped with a warning, as the run itself drops it when it resumes
    (:meth:`~fdattack.tracking.run_dir.RunDirectory.truncate_rounds`), so that a killed run can be reported. Any other
    bad line is refused; blank lines are skipped.

    Raises:
        DataError: naming the file and the line.
    """
    lines = _read_text(path).split("\n")  # the last item is "" when the file ends with a newline
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                log.warning("%s: skipped, not JSON: a round's record torn by a run killed while writing it", where)
                continue
            raise DataError(f"{where}: not JSON ({err.msg}, column {err.colno}); {ROUND_RECORD}") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: a JSON {_json_kind(row)}, not an object; {ROUND_RECORD}")
        if "round" not in row:
            raise DataError(f'{where}: no "round"; {ROUND_RECORD}')
        index = row["round"]
        integral = isinstance(index, int) and not isinstance(index, bool) or isinstance(index, float) and index.is_integer()
        if not integral or index < 0:  # 3.0 is a round: the mean over seeds records its rounds so
            raise DataError(f'{where}: "round" is {_shown(index)}; a round is an integer >= 0')
        _check_metrics(where, {key: value for key, value in row.items() if key != "round"})
        rows.append(row)
    return rows


def read_metrics(path: Path) -> dict[str, Any]:
    """``metrics.json``: one JSON object of numbers or nulls.

    Raises:
        DataError: naming the file (and the key of a value that is not a number).
    """
    try:
        metrics = json.loads(_read_text(path))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not JSON ({err}); {METRICS_RECORD}") from None
    if not isinstance(metrics, dict):
        raise DataError(f"{path}: a JSON {_json_kind(metrics)}, not an object; {METRICS_RECORD}")
    _check_metrics(str(path), metrics)
    return metrics


def load_run(path: Path) -> Run:
    """Read a run directory: ``rounds.jsonl`` (:func:`read_rounds`), ``metrics.json`` (:func:`read_metrics`), either of
    them alone, and ``config.yaml`` where it has one.

    Raises:
        DataError: no such folder, neither record, or a corrupt record or config, naming the file.
    """
    rounds_path, metrics_path, config_path = path / "rounds.jsonl", path / "metrics.json", path / "config.yaml"
    if not path.exists():
        raise DataError(f"{path}: no such run directory")
    if not path.is_dir():
        raise DataError(f"{path}: a file, not a run directory")
    if not rounds_path.is_file() and not metrics_path.is_file():
        raise DataError(f"{path}: not an fdattack run directory (neither rounds.jsonl nor metrics.json)")
    rounds = read_rounds(rounds_path) if rounds_path.is_file() else []
    final = {key: value for row in rounds for key, value in row.items() if key != "round"}
    if metrics_path.is_file():
        final.update(read_metrics(metrics_path))
    final = without_stopped_scores(final)  # an attack stopped mid-run has no last score either
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = flatten(OmegaConf.to_container(OmegaConf.load(config_path), resolve=False))
        except Exception as err:  # yaml's scanner and parser errors alike
            raise DataError(
                f"{config_path}: not a readable config ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
            ) from None
    return Run(path, config, rounds, final, finished=metrics_path.is_file())


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
