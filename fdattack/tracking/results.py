"""Reading a finished run's results back: only when the run was made with the config that asks for them.

Every place that takes a result from disk instead of computing it (a seed replica, a matrix simulation, a sweep trial,
a resumed run's stored config) goes through :func:`check_made_with`: the stored ``config.yaml`` must exist and agree
with the config of the run being asked for in every key that can change a result. The keys that cannot
(:data:`RESULT_FREE_KEYS`: the run's ``name``, ``resume``, ``output_dir``, ``cache_dir`` (a cached network is the one the
run would train), ``plugins`` and the whole ``logger`` group,
where and how a run logs, its W&B group and name included; and ``isolation.overlap``, when the attacks end their
rounds) are left out,
so a moved or copied folder is still its own result.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fdattack.errors import CheckpointError, DataError
from fdattack.tracking.run_records import read_metrics

#: Top-level config keys that change no result: a result made with other values of them is still this config's
#: (``plugins`` only makes names known; the names a run uses are in ``attacks``, ``defenses`` and ``protocol.name``).
RESULT_FREE_KEYS = ("name", "resume", "output_dir", "cache_dir", "logger", "plugins")
#: The ``isolation`` keys that decide a result, with the values a stored config written before they existed had in
#: effect: its budgets, which can stop an attack, and its mode (an isolated result is never one made in process, where an
#: attack could have read the run; and its attacks draw from a secret of the run's: ``attack_seed``).
#: ``isolation.overlap`` decides none (overlapping or not, the same results: tests/test_isolation.py).
ISOLATION_BUDGETS = {"seconds": None, "memory_mb": None, "mode": "in_process"}
#: the ``isolation`` keys that decide no result
ISOLATION_RESULT_FREE = ("overlap",)


def result_tree(cfg: DictConfig) -> dict:
    """The plain, resolved config tree without :data:`RESULT_FREE_KEYS` and :data:`ISOLATION_RESULT_FREE`: what decides a
    run's results."""
    tree = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    if not isinstance(tree, dict):
        return {}
    kept = {key: value for key, value in tree.items() if key not in RESULT_FREE_KEYS}
    isolation = kept.get("isolation")
    kept["isolation"] = {
        **ISOLATION_BUDGETS,
        **{k: v for k, v in (isolation if isinstance(isolation, dict) else {}).items() if k not in ISOLATION_RESULT_FREE},
    }
    return kept


def first_difference(old: Any, new: Any, prefix: str = "") -> str | None:
    """Dotted key of the first difference between two plain config trees (None when equal)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            name = f"{prefix}{key}"
            if key not in old or key not in new:
                return name
            found = first_difference(old[key], new[key], name + ".")
            if found is not None:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            found = first_difference(a, b, f"{prefix}{i}.")
            if found is not None:
                return found
        return None
    both_nan = isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new)
    same = (old == new and type(old) is type(new)) or both_nan
    return None if same else prefix.rstrip(".") or "<root>"


def shown(tree: Any, key: str) -> str:
    """The value at dotted ``key`` of a plain tree, as ``repr`` cut short; ``(absent)`` where it has none."""
    node = tree
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return "(absent)"
    text = repr(node)
    return text if len(text) <= 80 else text[:77] + "..."


def difference_from(stored: DictConfig, cfg: DictConfig) -> str | None:
    """``key (stored X, given Y)`` for the first result-deciding key where ``cfg`` differs from ``stored``; None if none."""
    old, new = result_tree(stored), result_tree(cfg)
    key = first_difference(old, new)
    return None if key is None else f"{key} (stored {shown(old, key)}, given {shown(new, key)})"


def stored_config(folder: Path) -> DictConfig:
    """The ``config.yaml`` that a run wrote in ``folder``.

    Raises:
        CheckpointError: missing (nothing then shows what the folder's results were made with) or unreadable.
    """
    path = folder / "config.yaml"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing, so nothing shows what the results in {folder} were made with")
    try:
        stored = OmegaConf.load(path)
    except Exception as err:  # yaml and OmegaConf errors alike
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{path}: unreadable stored config ({reason})") from None
    if not isinstance(stored, DictConfig):
        raise CheckpointError(f"{path}: not a config (a YAML mapping)")
    return stored


def check_made_with(folder: Path, cfg: DictConfig) -> None:
    """Check that the run in ``folder`` was made with ``cfg``: its ``config.yaml`` exists and agrees in every key that
    decides a result (:func:`result_tree`).

    Raises:
        CheckpointError: naming the file and the first differing key with its stored and given values.
    """
    difference = difference_from(stored_config(folder), cfg)
    if difference is not None:
        raise CheckpointError(f"{folder / 'config.yaml'}: made with other settings than these: {difference}")


def read_result(folder: Path, cfg: DictConfig) -> dict[str, float]:
    """The final metrics of the finished run in ``folder`` (its ``metrics.json``), which must have been made with ``cfg``
    (:func:`check_made_with`); a metric recorded as null is NaN.

    Raises:
        CheckpointError: the run was made with another config, or nothing shows with which.
        DataError: ``metrics.json`` is missing, not a JSON object, or holds a value that is not a number or null.
    """
    check_made_with(folder, cfg)
    path = folder / "metrics.json"
    if not path.is_file():
        raise DataError(f"{path}: missing; the run in {folder} has not finished")
    return {key: math.nan if value is None else float(value) for key, value in read_metrics(path).items()}
