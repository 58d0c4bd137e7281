"""Reading a cell of ``matrix.json`` for the page: what it shows for a metric (:class:`Shown`), where the cells are, and
which way a metric leaks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Metric suffixes for which a lower value means more leakage (a distance to the truth).
LOWER_LEAKS = ("/kl",)
#: The utility of a privacy–utility plot: the clients' accuracy, else the server's (FedAvg has no client accuracy).
UTILITY_X = ("protocol/client_acc_mean", "protocol/server_acc")


@dataclass(frozen=True)
class Shown:
    """What one cell shows for one metric: its finite mean and interval, or a word (``n/a``, ``failed``, ...) and why."""

    mean: float | None = None
    low: float | None = None
    high: float | None = None
    word: str = ""
    reason: str = ""

    def interval(self) -> str:
        """``[low, high]`` where both are finite, else empty."""
        return f"[{number(self.low)}, {number(self.high)}]" if self.low is not None and self.high is not None else ""

    def text(self, between: str = " ") -> str:
        """The mean and its interval joined by ``between``, or the word."""
        if self.mean is None:
            return self.word
        return between.join(filter(None, (number(self.mean), self.interval())))


def finite(value: Any) -> float | None:
    """``value`` as a float where it is a finite number, else None (null and NaN alike)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def number(value: float | None) -> str:
    """Three significant digits; large counts (bytes) in full with thousands separators."""
    if value is None:
        return "nan"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def lower_leaks(metric: str) -> bool:
    """Whether a lower value of ``metric`` means more leakage."""
    return metric.endswith(LOWER_LEAKS)


def shown(cell: dict | None, metric: str) -> Shown:
    """What ``cell`` (a ``matrix.json`` cell, None where it is missing) shows for ``metric``."""
    if cell is None:
        return Shown(word="–", reason="no such cell in the matrix")
    if cell.get("status") != "done":
        return Shown(word=str(cell.get("status")), reason=cell.get("reason") or "")
    parts = metric.split("/")
    skipped = cell.get("not_applicable") or {}
    if parts[0] == "attack" and len(parts) > 1 and parts[1] in skipped:
        return Shown(word="n/a", reason=str(skipped[parts[1]]))
    stopped = cell.get("stopped") or {}
    if parts[0] == "attack" and len(parts) > 1 and parts[1] in stopped:
        return Shown(word="stopped", reason=f"a seed stopped {parts[1]} ({stopped[parts[1]]}): no score; it runs again next time")
    values = (cell.get("metrics") or {}).get(metric)
    if values is None:
        return Shown(word="–", reason=f"{metric} was not recorded in this cell")
    mean = finite(values.get("mean"))
    if mean is None:
        return Shown(word="nan", reason=f"{metric} is not a number (a seed recorded none)")
    low, high = finite(values.get("ci_low")), finite(values.get("ci_high"))
    return Shown(mean, low if high is not None else None, high if low is not None else None)


def cells_by_place(matrix: dict) -> dict[tuple[str, str, str], dict]:
    """(data, protocol, defense) -> its cell."""
    return {(c["data"], c["protocol"], c["defense"]): c for c in matrix.get("cells", [])}


def utility_of(cell: dict | None) -> tuple[str, Shown]:
    """The first of :data:`UTILITY_X` that ``cell`` recorded as a number (the last one's Shown where none)."""
    for key in UTILITY_X:
        value = shown(cell, key)
        if value.mean is not None:
            break
    return key, value
