"""A run directory read back: ``rounds.jsonl`` and ``metrics.json`` checked line by line (a corrupt record is one
line naming the file), ``config.yaml`` flattened to dotted keys, as one :class:`Run`. ``fdattack report``, the
seeds' aggregate readers and :mod:`fdattack.tracking.results` read runs through it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from fdattack.errors import DataError
from fdattack.tracking.stopped_attacks import without_stopped_scores

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
