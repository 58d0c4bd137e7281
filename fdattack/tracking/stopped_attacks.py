"""An attack stopped during a run has no final score.

An isolated attack whose worker failed, overran its seconds or its memory is stopped (:mod:`fdattack.isolation.proxy`)
and records ``attack/<name>/stopped/<why>`` = 1 from that round on. What it scored in earlier rounds is what it
scored then, not its answer: in the final metrics (``metrics.json``, the closing table), the seeds' aggregate and the
matrix its scores are NaN (``null`` on disk) beside the ``stopped`` key, at every seed where any seed stopped it, so
that no mean is taken over the seeds it happened to finish.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

#: the part of an attack's metric key that says it was stopped: ``attack/<name>/stopped/<why>``
STOPPED = "stopped"


def stopped_attacks(metrics: Mapping[str, object]) -> dict[str, str]:
    """Attack name -> why it was stopped (``failed``, ``seconds`` or ``memory``; several joined by ``, ``) for each
    ``attack/<name>/stopped/<why>`` key of ``metrics`` set to a number above 0."""
    found: dict[str, list[str]] = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "attack" and parts[2] == STOPPED and _positive(value):
            found.setdefault(parts[1], []).append(parts[3])
    return {name: ", ".join(sorted(whys)) for name, whys in sorted(found.items())}


def listed(stopped: Mapping[str, str]) -> str:
    """``name (why), ...`` of :func:`stopped_attacks`' answer, for one line."""
    return ", ".join(f"{name} ({why})" for name, why in stopped.items())


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def is_stopped_key(key: str) -> bool:
    """Whether ``key`` is an ``attack/<name>/stopped/<why>`` key."""
    parts = key.split("/")
    return len(parts) == 4 and parts[0] == "attack" and parts[2] == STOPPED


def without_scores_of(metrics: Mapping[str, object], attacks: Iterable[str]) -> dict[str, object]:
    """``metrics`` with every ``attack/<name>/...`` value of ``attacks`` NaN but their ``stopped`` keys."""
    prefixes = tuple(f"attack/{name}/" for name in attacks)
    if not prefixes:
        return dict(metrics)
    return {key: math.nan if key.startswith(prefixes) and not is_stopped_key(key) else value for key, value in metrics.items()}


def without_stopped_scores(metrics: Mapping[str, object]) -> dict[str, object]:
    """``metrics`` (one run's final metrics) with the scores of the attacks it stopped NaN (:func:`without_scores_of`)."""
    return without_scores_of(metrics, stopped_attacks(metrics))


def stopped_in_any(replicas: Iterable[Mapping[str, object]]) -> dict[str, str]:
    """Attack name -> why, for each attack stopped at any of ``replicas`` (one metrics dict per seed)."""
    found: dict[str, set[str]] = {}
    for replica in replicas:
        for name, why in stopped_attacks(replica).items():
            found.setdefault(name, set()).update(why.split(", "))
    return {name: ", ".join(sorted(whys)) for name, whys in sorted(found.items())}
