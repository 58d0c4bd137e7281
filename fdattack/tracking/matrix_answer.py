"""What the matrix page leads with: per attack and place (data, protocol), whether the undefended attack leaks beyond
its baseline, and the defense setting that brings it to the baseline at the least cost in the clients' accuracy.

An attack's headline metric leaks where the mean of its per-seed differences from its baseline (:data:`BASELINES`:
chance for an accuracy or top-1, the seed's uniform guess for LDIA's KL, 0.5 for an AUC, 1 % for the TPR at 1 % FPR)
has a 95 % t interval wholly on the leaky side of 0: the seeds are the independent unit, and a seed's baseline is
compared with that seed's value. A defense setting stops the attack where, by the same test, it no longer leaks (the
interval of its per-seed differences from the baseline holds 0 or lies on the other side); its cost is the undefended
clients' accuracy less the defended (the server's where the protocol has no client accuracy).
"""

from __future__ import annotations

import html
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from fdattack.functional.intervals import t_interval
from fdattack.tracking.matrix_cells import Shown, cells_by_place, finite, lower_leaks, number, shown, utility_of

#: decimals kept of a difference: metrics stored from float32 differ from equal float64 ones by about 1e-9, which
#: must not read as a leak (0.05 against chance 0.05 at every seed)
DIGITS = 6
#: the names of the answer's copies of the cells' images in the page's ``plots/``
IMAGE_PREFIX = "answer__"
#: headline metric -> its baseline: another metric of the same attack (its name), or a constant
BASELINES: dict[str, Union[str, float]] = {
    "accuracy": "chance",
    "top1": "chance",
    "kl": "uniform_kl",
    "auc": 0.5,
    "tpr_at_1pct_fpr": 0.01,
}


def baseline_of(cell: Optional[dict], metric: str) -> Optional[float]:
    """The baseline of ``metric`` (``attack/<name>/<headline>``) in ``cell``: a constant, or the cell's mean of the
    attack's baseline metric; None where it has none."""
    _, attack, name = metric.split("/", 2)
    base = BASELINES.get(name)
    if base is None or isinstance(base, float):
        return base
    return shown(cell, f"attack/{attack}/{base}").mean


def paired_difference(cell: Optional[dict], metric: str) -> Shown:
    """The mean of ``cell``'s per-seed differences ``metric`` − its baseline and their t interval (a seed with either
    value missing is left out; no interval under two seeds)."""
    values = ((cell or {}).get("metrics") or {}).get(metric) or {}
    seeds = values.get("values") or []
    _, attack, name = metric.split("/", 2)
    base = BASELINES.get(name)
    if isinstance(base, str):
        bases = (((cell or {}).get("metrics") or {}).get(f"attack/{attack}/{base}") or {}).get("values") or []
    else:
        bases = [base] * len(seeds)
    pairs = zip(map(finite, seeds), map(finite, bases))
    differences = [round(v - b, DIGITS) for v, b in pairs if v is not None and b is not None]
    if not differences:
        return Shown(word="–", reason=f"no seed recorded {metric} and its baseline")
    low, high = t_interval(differences)
    mean = sum(differences) / len(differences)
    return Shown(mean, finite(low), finite(high)) if finite(low) is not None and finite(high) is not None else Shown(mean)


def leaks(difference: Shown, metric: str) -> bool:
    """Whether the paired ``difference`` from the baseline has its interval wholly on the leaky side of 0 (above it, or
    below for a distance)."""
    if difference.low is None or difference.high is None:
        return False
    return difference.high < 0 if lower_leaks(metric) else difference.low > 0


@dataclass(frozen=True)
class Stop:
    """A defense setting that brings the attack to its baseline: its value and the clients' accuracy it costs."""

    defense: str
    value: Shown
    cost: Optional[float]


@dataclass(frozen=True)
class Answer:
    """One attack's headline metric at one place, undefended, and the cheapest defense setting that stops it."""

    attack: str
    metric: str
    data: str
    protocol: str
    value: Shown
    baseline: float
    difference: Shown  # the per-seed differences from the baseline, paired by seed
    leaks: bool
    cheapest: Optional[Stop]
    tried: int  # defense settings measured at this place
    by_defense: dict[str, Optional[Stop]] = field(default_factory=dict)  # a defense (its curve) -> its cheapest stop


def defense_families(matrix: dict) -> dict[str, str]:
    """Each defense setting's defense: the curve it belongs to (``laplace_1`` -> ``laplace``), else itself."""
    family = {d: d for d in matrix["axes"]["defenses"]}
    for name, curve in (matrix.get("curves") or {}).items():
        family.update({setting: name for setting, _ in curve.get("settings", [])})
    return family


def answers(matrix: dict) -> list[Answer]:
    """Every attack's first headline metric with a baseline, at every place whose undefended cell measured it."""
    undefended = matrix.get("undefended")
    if undefended is None:
        return []
    cells, axes, found, families = cells_by_place(matrix), matrix["axes"], [], defense_families(matrix)
    for attack, metrics in (matrix.get("headline") or {}).items():
        metric = next((m for m in metrics if m.rsplit("/", 1)[-1] in BASELINES), None)
        if metric is None:
            continue
        for data in axes["data"]:
            for protocol in axes["protocols"]:
                base_cell = cells.get((data, protocol, undefended))
                value, baseline = shown(base_cell, metric), baseline_of(base_cell, metric)
                if value.mean is None or baseline is None:
                    continue
                stops, tried, measured = [], 0, set()
                _, before = utility_of(base_cell)
                for defense in axes["defenses"]:
                    cell = cells.get((data, protocol, defense))
                    defended = shown(cell, metric)
                    if defense == undefended or defended.mean is None:
                        continue
                    tried += 1
                    measured.add(families[defense])
                    after_defense = paired_difference(cell, metric)
                    if after_defense.mean is not None and not leaks(after_defense, metric):  # no longer beyond the baseline
                        _, after = utility_of(cell)
                        cost = None if before.mean is None or after.mean is None else round(before.mean - after.mean, DIGITS)
                        stops.append(Stop(defense, defended, cost))
                cheapest = _cheapest(stops)
                by_defense = {
                    f: _cheapest([s for s in stops if families[s.defense] == f]) for f in dict.fromkeys(families.values()) if f in measured
                }
                difference = paired_difference(base_cell, metric)
                leaky = leaks(difference, metric)
                found.append(Answer(attack, metric, data, protocol, value, baseline, difference, leaky, cheapest, tried, by_defense))
    return found


def _cheapest(stops: list[Stop]) -> Optional[Stop]:
    """The stop of the least accuracy cost (an unknown cost last), or None."""
    return min(stops, key=lambda s: float("inf") if s.cost is None else s.cost, default=None)


def per_defense(a: Answer) -> str:
    """Each measured defense's cheapest setting that stops ``a``, with its cost, or that none of its settings does."""
    told = []
    for defense, stop in a.by_defense.items():
        if stop is None:
            told.append(f"{defense}: none")
        else:
            cost = "cost unknown" if stop.cost is None else f"{stop.cost:+.3g}"
            told.append(f"{defense}: {stop.defense} ({cost})")
    return "; ".join(told)


def answer_html(matrix: dict, out: Path | None = None, images_from: Path | None = None) -> str:
    """The table the page leads with (empty without an undefended setting or a metric with a baseline); beside a
    reconstruction attack's number, the undefended cell's images of its first seed's last round, copied from
    ``images_from`` (the matrix's root) into ``out/plots``."""
    rows = answers(matrix)
    if not rows:
        return ""
    body = "".join("<tr>" + "".join(f"<td class='text'>{cell}</td>" for cell in _row(a)) + "</tr>" for a in rows)
    head = "".join(
        f"<th>{t}</th>"
        for t in (
            "attack",
            "metric",
            "data / protocol",
            "undefended [95 % interval]",
            "baseline",
            "− baseline, paired by seed",
            "leaks",
            "cheapest setting that stops it (its value; accuracy cost)",
            "per defense: its cheapest stop (accuracy cost)",
        )
    )
    return (
        "<section id='answer'><h2>Where each attack leaks, and what stops it</h2><p class='note'>Undefended: the mean over the "
        "seeds and its 95 % interval; it leaks where the mean of its per-seed differences from the baseline (chance, the "
        "seed's uniform guess, an AUC of 0.5) has a 95 % t interval wholly beyond 0. A defense setting stops it where, by the "
        "same test, it no longer leaks; its cost is the clients' accuracy it takes (the server's for FedAvg).</p>"
        f"{sentences_html(rows)}<div class='scroll'><table class='answer'><tr>{head}</tr>{body}</table></div>"
        f"{gallery_html(matrix, rows, out, images_from)}</section>"
    )


def gallery_html(matrix: dict, rows: list[Answer], out: Path | None, images_from: Path | None) -> str:
    """Beside the numbers, what they score: for each place a reconstruction attack leaks undefended, the images of its
    first seed's last round (copied from ``images_from``, the matrix's root, into ``out/plots``), captioned with the
    score; nothing where the matrix saved none."""
    cells = cells_by_place(matrix)
    figures = [_figure(a, cells.get((a.data, a.protocol, matrix["undefended"])), out, images_from) for a in rows if a.leaks]
    shown = [f for f in figures if f]
    if not shown:
        return ""
    return (
        "<h3>What the leaks look like</h3><p class='note'>Each attack's reconstructions where it leaks undefended, at the "
        "cell's first seed and last round, in the run's own layout (a row per target: the reconstruction, then what the "
        "run draws beside it, such as the target's private and public means). Click for full size.</p>"
        f"<div class='gallery'>{''.join(shown)}</div>"
    )


def _figure(a: Answer, cell: Optional[dict], out: Path | None, images_from: Path | None) -> str:
    """The ``<figure>`` of ``a``'s undefended images (copied into ``out/plots``), or nothing."""
    saved = ((cell or {}).get("images") or {}).get(a.attack) or []
    if out is None or images_from is None or not saved or not (images_from / saved[0]).is_file():
        return ""
    name = f"{IMAGE_PREFIX}{a.attack}__{a.data}__{a.protocol}.png"
    shutil.copyfile(images_from / saved[0], out / "plots" / name)
    seed = ((cell or {}).get("seeds") or ["?"])[0]
    caption = f"{a.attack}, {a.data} / {a.protocol}, seed {seed}: {a.value.text()} against {number(a.baseline)}"
    return (
        f"<figure><a href='plots/{name}'><img src='plots/{name}' alt='{html.escape(saved[0])}'></a>"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _row(a: Answer) -> list[str]:
    if not a.leaks:
        stop = "– (no leak to stop)"
    elif a.cheapest is None:
        stop = f"none of the {a.tried} setting(s)" if a.tried else "no defense measured here"
    else:
        cost = "cost unknown" if a.cheapest.cost is None else f"accuracy cost {a.cheapest.cost:+.3g}"
        stop = f"{a.cheapest.defense}: {a.cheapest.value.text()} ({cost})"
    return [
        html.escape(a.attack),
        html.escape(a.metric.rsplit("/", 1)[-1]),
        html.escape(f"{a.data} / {a.protocol}"),
        html.escape(a.value.text()),
        html.escape(number(a.baseline)),
        html.escape(a.difference.text()),
        "yes" if a.leaks else "no",
        html.escape(stop),
        html.escape(per_defense(a) if a.leaks else "–"),
    ]


def sentence(attack: str, rows: list[Answer]) -> str:
    """One sentence on ``attack``: at how many places it leaks undefended and where most, the cheapest defense setting
    that stops it there and its cost, and at how many leaking places some setting does; or that it leaks nowhere here."""
    leaking = [a for a in rows if a.leaks]
    most = max(leaking or rows, key=_leak_size)
    where = f"{most.data} / {most.protocol}"
    if not leaking:
        return (
            f"{attack} leaks at none of the {len(rows)} place(s) it was measured undefended (nearest to it {where}: "
            f"{number(most.value.mean)} against {number(most.baseline)}, {most.difference.text()} from it, paired by seed)."
        )
    value = f"{number(most.value.mean)} against {number(most.baseline)}"
    told = f"{attack} leaks at {len(leaking)} of {len(rows)} place(s) undefended, most at {where} ({value})"
    stop = most.cheapest
    if stop is None:
        there = f"no setting measured there stops it ({most.tried} tried)" if most.tried else "no defense was measured there"
    else:
        cost = "an unknown accuracy cost" if stop.cost is None else f"an accuracy cost of {number(stop.cost)}"
        there = f"the cheapest setting that stops it there is {stop.defense} ({stop.value.text()}, {cost})"
    stopped = sum(a.cheapest is not None for a in leaking)
    return f"{told}; {there}; some setting stops it at {stopped} of the {len(leaking)} leaking place(s)."


def _leak_size(a: Answer) -> float:
    """How far ``a`` lies beyond its baseline on the leaky side (negative where it falls short of it)."""
    if a.difference.mean is None:
        return float("-inf")
    return -a.difference.mean if lower_leaks(a.metric) else a.difference.mean


def sentences_html(rows: list[Answer]) -> str:
    """One sentence per attack, as a list."""
    by_attack: dict[str, list[Answer]] = {}
    for a in rows:
        by_attack.setdefault(a.attack, []).append(a)
    items = "".join(f"<li>{html.escape(sentence(attack, found))}</li>" for attack, found in by_attack.items())
    return f"<ul class='sentences'>{items}</ul>"
