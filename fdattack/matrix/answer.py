"""What the matrix page leads with: per attack and place (data, protocol), whether the undefended attack leaks beyond
what the attacker gets without the protocol's data, and the cheapest defense setting shown to bring it back within a
margin of that.

**The control.** An attack's leak is measured against the attacker's best without the protocol (:func:`control_of`),
per seed and paired: the largest, seed by seed, of what applies among chance (or the uniform guess of LDIA's KL, an AUC
of 0.5, a TPR of 1 % at 1 % FPR: what an attacker with no data scores, provably so for membership, whose members and
non-members are exchangeable when nothing of them is learned), the public-only priors of the reconstruction attacks
(PLI's learned prior, ``attack/<any>/prior_<metric>``, and the plain public look, ``attack/public_mean/<metric>``), and
the same attack in the data setting's control run (``control:`` in the matrix file: the protocol with nothing of the
private data learned). For a distance (LDIA's KL) the smallest. Taking the best of several is conservative: it can only
shrink a leak.

**The verdict** (:func:`fdattack.statistics.verdicts.decide`): *leaks* (the 95 % interval of the per-seed
differences wholly above 0), *stopped* (its one-sided 95 % upper bound below the margin δ fixed before the run:
:data:`~fdattack.statistics.verdicts.MARGINS`, or the matrix file's ``margins:``), *undecided* (neither), *unknown*
(fewer than two seeds). A defense setting stops the attack only where its own verdict is *stopped*; the cheapest such
setting is the one that costs the clients the least accuracy (the server's where the protocol has no client
accuracy). A setting *reduces* the attack where its difference from no defense, seed by seed, survives Holm's
correction over the matrix's comparisons on the leaky side (:mod:`fdattack.matrix.comparisons`).
"""

from __future__ import annotations

import html
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from fdattack.matrix.shown import Shown, cells_by_place, finite, lower_leaks, number, shown, utility_of
from fdattack.statistics.kinds import metric_range
from fdattack.statistics.verdicts import ALPHA, MARGINS, Decision, Verdict, decide, is_reduction

#: decimals kept of a difference: metrics stored from float32 differ from equal float64 ones by about 1e-9, which
#: must not read as a leak (0.05 against chance 0.05 at every seed)
DIGITS = 6
#: the names of the answer's copies of the cells' images in the page's ``plots/``
IMAGE_PREFIX = "answer__"
#: the defense setting of a data setting's control run (as :data:`fdattack.matrix.spec.CONTROL`)
CONTROL = "control"
#: attacks that read nothing from the protocol (the public look): controls of the others, never answered for
CONTROL_ATTACKS = ("public_mean",)
#: headline metric -> what an attacker with no data scores: another metric of the same attack (its name), or a constant
BASELINES: dict[str, Union[str, float]] = {
    "accuracy": "chance",
    "top1": "chance",
    "kl": "uniform_kl",
    "auc": 0.5,
    "tpr_at_1pct_fpr": 0.01,
}
#: how a verdict reads in the answer table of the undefended cell
WORDS = {Verdict.leaks: "leaks", Verdict.stopped: "no leak beyond δ", Verdict.undecided: "undecided", Verdict.unknown: "unknown"}


def baseline_of(cell: Optional[dict], metric: str) -> Optional[float]:
    """What an attacker with no data scores at ``metric`` (``attack/<name>/<headline>``) in ``cell``: a constant, or
    the cell's mean of the attack's baseline metric; None where it has none (the heatmaps centre their colours on it)."""
    _, attack, name = metric.split("/", 2)
    base = BASELINES.get(name)
    if base is None or isinstance(base, float):
        return base
    return shown(cell, f"attack/{attack}/{base}").mean


PerSeed = dict[int, tuple[float, float]]  # seed -> (value, within-run variance; NaN where unknown)


def per_seed(cell: Optional[dict], key: str) -> PerSeed:
    """``key``'s finite value at each seed of ``cell`` with its within-run variance (``matrix.json``'s ``within``)."""
    if not cell or cell.get("status") != "done":
        return {}
    entry = (cell.get("metrics") or {}).get(key) or {}
    values, within = entry.get("values") or [], entry.get("within") or []
    found = {}
    for i, seed in enumerate(cell.get("seeds") or []):
        value = finite(values[i]) if i < len(values) else None
        if value is not None:
            variance = finite(within[i]) if i < len(within) else None
            found[int(seed)] = (value, math.nan if variance is None else variance)
    return found


@dataclass(frozen=True)
class Control:
    """The attacker's best without the protocol at one place, per seed, and what it was drawn from."""

    values: PerSeed
    sources: tuple[str, ...]

    @property
    def mean(self) -> Optional[float]:
        return sum(v for v, _ in self.values.values()) / len(self.values) if self.values else None


def control_of(cells: dict[tuple[str, str, str], dict], judged: Optional[dict], metric: str) -> Control:
    """The control of ``metric`` for the ``judged`` cell: per seed the best of its candidates (see the module docstring)
    that the judged cell itself or its place's control run recorded at that seed."""
    _, attack, name = metric.split("/", 2)
    judged = judged or {}
    control_cell = cells.get((judged.get("data"), judged.get("protocol"), CONTROL))
    seeds = [int(s) for s in judged.get("seeds") or []]
    candidates: dict[str, PerSeed] = {}
    base = BASELINES.get(name)
    if isinstance(base, float):
        candidates[f"{base:g}"] = {s: (base, 0.0) for s in seeds}
    elif isinstance(base, str):
        candidates[base] = per_seed(judged, f"attack/{attack}/{base}")
    if not lower_leaks(metric):
        others = sorted({key.split("/")[1] for key in judged.get("metrics") or {} if key.startswith("attack/")})
        for key in [f"attack/{other}/prior_{name}" for other in others] + [f"attack/public_mean/{name}"]:
            found = per_seed(judged, key)
            if found and key != metric:
                candidates[key.removeprefix("attack/")] = found
    found = per_seed(control_cell, metric)
    if found:
        candidates["the control run"] = found
    pick = min if lower_leaks(metric) else max
    values: PerSeed = {}
    for seed in seeds:
        at_seed = [c[seed] for c in candidates.values() if seed in c]
        if at_seed:
            values[seed] = pick(at_seed, key=lambda pair: pair[0])
    return Control(values, tuple(candidates))


def margin_of(matrix: dict, cell: Optional[dict], metric: str) -> Optional[float]:
    """δ of ``metric``: the matrix file's ``margins:``, else :data:`~fdattack.statistics.verdicts.MARGINS` (a metric
    name there: that metric's mean in ``cell``, such as chance); None where there is none."""
    _, attack, name = metric.split("/", 2)
    given = (matrix.get("margins") or {}).get(name, MARGINS.get(name))
    if isinstance(given, str):
        return shown(cell, f"attack/{attack}/{given}").mean
    return given


def decision_of(cell: Optional[dict], metric: str, control: Control, margin: float, alpha: float = ALPHA) -> Decision:
    """``cell``'s verdict at ``metric`` against ``control``, over the seeds both recorded; a seed's within-run variance
    is the value's plus the control's (0 for a control with none: a constant or a quantity computed from the truth,
    such as the uniform guess's KL)."""
    values = per_seed(cell, metric)
    seeds = [s for s in values if s in control.values]
    within = [values[s][1] + (control.values[s][1] if math.isfinite(control.values[s][1]) else 0.0) for s in seeds]
    return decide(
        [round(values[s][0], DIGITS) for s in seeds],
        [round(control.values[s][0], DIGITS) for s in seeds],
        margin,
        lower_leaks=lower_leaks(metric),
        within=within,
        bounds=metric_range(metric),
        alpha=alpha,
    )


@dataclass(frozen=True)
class Setting:
    """A defense setting at one place: its value, its verdict against the control, its accuracy cost, and whether it
    reduces the attack against no defense (Holm)."""

    defense: str
    family: str  # the defense (its curve) it is a setting of
    value: Shown
    control: Control
    decision: Decision
    cost: Optional[float]
    reduces: bool

    @property
    def stops(self) -> bool:
        return self.decision.verdict is Verdict.stopped


@dataclass(frozen=True)
class Answer:
    """One attack's headline metric at one place: undefended against its control, and every defense setting."""

    attack: str
    metric: str
    data: str
    protocol: str
    value: Shown
    control: Control
    decision: Decision  # undefended against the control, paired by seed
    settings: list[Setting]
    by_defense: dict[str, Optional[Setting]] = field(default_factory=dict)  # a defense (its curve) -> its cheapest stop

    @property
    def leaks(self) -> bool:
        return self.decision.verdict is Verdict.leaks

    @property
    def baseline(self) -> Optional[float]:
        """The control's mean over the seeds."""
        return self.control.mean

    @property
    def tried(self) -> int:
        return len(self.settings)

    @property
    def cheapest(self) -> Optional[Setting]:
        """The stopping setting of the least accuracy cost (an unknown cost last), or None."""
        return _cheapest([s for s in self.settings if s.stops])


def defense_families(matrix: dict) -> dict[str, str]:
    """Each defense setting's defense: the curve it belongs to (``laplace_1`` -> ``laplace``), else itself."""
    family = {d: d for d in matrix["axes"]["defenses"]}
    for name, curve in (matrix.get("curves") or {}).items():
        family.update({setting: name for setting, _ in curve.get("settings", [])})
    return family


def _reductions(matrix: dict) -> set[tuple[str, str, str, str]]:
    """(data, protocol, metric, defense) whose difference from no defense survives Holm on the leaky side."""
    rows = (matrix.get("comparisons") or {}).get("rows") or []
    return {
        (r["data"], r["protocol"], r["metric"], r["defense"])
        for r in rows
        if is_reduction(r["mean"], bool(r.get("survives")), lower_leaks(r["metric"]))
    }


def answers(matrix: dict) -> list[Answer]:
    """Every attack's first headline metric with a baseline, at every place whose undefended cell measured it, each test
    at the matrix's ``alpha`` (0.05; less where ``--decide`` spent it over several looks)."""
    alpha = float(matrix.get("alpha", ALPHA))
    undefended = matrix.get("undefended")
    if undefended is None:
        return []
    cells, axes, found, families = cells_by_place(matrix), matrix["axes"], [], defense_families(matrix)
    reductions = _reductions(matrix)
    for attack, metrics in (matrix.get("headline") or {}).items():
        metric = next((m for m in metrics if m.rsplit("/", 1)[-1] in BASELINES), None)
        if metric is None or attack in CONTROL_ATTACKS:
            continue
        for data in axes["data"]:
            for protocol in axes["protocols"]:
                base_cell = cells.get((data, protocol, undefended))
                value, margin = shown(base_cell, metric), margin_of(matrix, base_cell, metric)
                control = control_of(cells, base_cell, metric)
                if value.mean is None or control.mean is None or margin is None:
                    continue
                _, before = utility_of(base_cell)
                settings = []
                for defense in axes["defenses"]:
                    cell = cells.get((data, protocol, defense))
                    defended = shown(cell, metric)
                    if defense in (undefended, CONTROL) or defended.mean is None:
                        continue
                    _, after = utility_of(cell)
                    cost = None if before.mean is None or after.mean is None else round(before.mean - after.mean, DIGITS)
                    own = control_of(cells, cell, metric)
                    decision = decision_of(cell, metric, own, margin, alpha)
                    reduces = (data, protocol, metric, defense) in reductions
                    settings.append(Setting(defense, families[defense], defended, own, decision, cost, reduces))
                measured = dict.fromkeys(s.family for s in settings)
                by_defense = {f: _cheapest([s for s in settings if s.stops and s.family == f]) for f in measured}
                decision = decision_of(base_cell, metric, control, margin, alpha)
                found.append(Answer(attack, metric, data, protocol, value, control, decision, settings, by_defense))
    return found


def _cheapest(stops: list[Setting]) -> Optional[Setting]:
    """The setting of the least accuracy cost (an unknown cost last), or None."""
    return min(stops, key=lambda s: float("inf") if s.cost is None else s.cost, default=None)


def difference_text(d: Decision) -> str:
    """The mean leak-side difference with its interval and seeds, or the word where there is none."""
    if not math.isfinite(d.mean):
        return "–"
    interval = f" [{d.low:+.3g}, {d.high:+.3g}]" if math.isfinite(d.low) and math.isfinite(d.high) else ""
    return f"{d.mean:+.3g}{interval} ({d.n} seeds)"


def per_defense(a: Answer) -> str:
    """Each measured defense's cheapest setting shown to stop ``a``, with its cost, or how its settings stand."""
    told = []
    for defense, stop in a.by_defense.items():
        if stop is not None:
            cost = "cost unknown" if stop.cost is None else f"{stop.cost:+.3g}"
            told.append(f"{defense}: {stop.defense} ({cost})")
            continue
        mine = [s for s in a.settings if s.family == defense]
        counts = {v: sum(s.decision.verdict is v for s in mine) for v in (Verdict.leaks, Verdict.undecided, Verdict.unknown)}
        reduced = [s.defense for s in mine if s.reduces]
        state = ", ".join(f"{n} {v.value}" for v, n in counts.items() if n) or "none"
        told.append(f"{defense}: no stop ({state}{'; reduces at ' + ', '.join(reduced) if reduced else ''})")
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
            "control (the attacker's best without the protocol)",
            "− control, paired by seed [95 % interval]",
            "margin δ",
            "verdict",
            "cheapest setting shown to stop it (its value; accuracy cost)",
            "per defense: its cheapest stop (accuracy cost), else how its settings stand",
        )
    )
    return (
        "<section id='answer'><h2>Where each attack leaks, and what stops it</h2><p class='note'>Each attack against its "
        "control, the attacker's best without the protocol's data, seed by seed: the best of chance (the uniform guess, an "
        "AUC of 0.5), the public-only priors and public look of the reconstruction attacks, and the attack in the data "
        "setting's control run. It <b>leaks</b> where the 95 % interval of the per-seed differences (the seeds' spread, "
        "floored by each seed's own within-run spread) lies wholly beyond 0; it is <b>stopped</b> (no leak beyond δ) where "
        "the one-sided 95 % upper bound of that difference lies below the margin δ fixed before the run; otherwise it is "
        "<b>undecided</b>, and with fewer than two seeds <b>unknown</b>. A defense setting stops the attack only where it "
        "is shown to; its cost is the clients' accuracy it takes (the server's for FedAvg); it <b>reduces</b> the attack "
        "where its difference from no defense survives Holm's correction.</p>"
        f"{sentences_html(rows)}<div class='scroll'><table class='answer'><tr>{head}</tr>{body}</table></div>"
        f"{seeds_html(matrix)}{gallery_html(matrix, rows, out, images_from)}</section>"
    )


def seeds_html(matrix: dict) -> str:
    """Where ``--decide`` added seeds: its design, one line per look (the verdicts it counted and why it went on or
    stopped), and each cell's seeds with why it stopped; a line on the α otherwise."""
    decided = matrix.get("decide")
    if not decided:
        seeds = len(matrix.get("seeds") or [])
        return f"<p class='note'>Every cell at the file's {seeds} seeds; each test at α = {matrix.get('alpha', ALPHA):g}.</p>"
    design = decided["design"]
    looks = "".join(
        f"<li>look {look['look']} ({look['minutes']:g} min): undefended {_counts(look['verdicts']['undefended'])}; defended "
        f"{_counts(look['verdicts']['defended'])}; {html.escape(look['why'])}</li>"
        for look in decided["looks"]
    )
    cells = "".join(
        f"<tr><td class='text'>{html.escape(cell_id)}</td><td>{len(entry['seeds'])}</td>"
        f"<td class='text'>{html.escape(entry.get('why', ''))}</td></tr>"
        for cell_id, entry in sorted(decided["cells"].items())
    )
    return (
        f"<h3>Seeds until decided</h3><p class='note'>--decide: the file's {len(design['first'])} seeds, then {design['batch']} more a "
        f"look to the cells a verdict waits on, up to {design['max_seeds']} seeds and {design['budget_minutes']:g} minutes: "
        f"{design['looks']} looks planned, each test at α = {design['alpha']:.3g} so that any false verdict stays below "
        f"{ALPHA:g} whichever look a cell stops at.</p><ul>{looks}</ul><details><summary>Each cell's seeds and why it stopped"
        f"</summary><table><tr><th>cell</th><th>seeds</th><th>why</th></tr>{cells}</table></details>"
    )


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {WORDS[Verdict(v)]}" for v, n in counts.items() if n) or "none"


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
    caption = f"{a.attack}, {a.data} / {a.protocol}, seed {seed}: {a.value.text()} against its control's {number(a.baseline)}"
    return (
        f"<figure><a href='plots/{name}'><img src='plots/{name}' alt='{html.escape(saved[0])}'></a>"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _row(a: Answer) -> list[str]:
    if a.decision.verdict is not Verdict.leaks:
        stop = f"– ({WORDS[a.decision.verdict]} undefended)"
    elif a.cheapest is None:
        undecided = sum(s.decision.verdict is Verdict.undecided for s in a.settings)
        stop = f"none shown of the {a.tried} setting(s) ({undecided} undecided)" if a.tried else "no defense measured here"
    else:
        cost = "cost unknown" if a.cheapest.cost is None else f"accuracy cost {a.cheapest.cost:+.3g}"
        stop = f"{a.cheapest.defense}: {a.cheapest.value.text()} ({cost})"
    control = f"{number(a.control.mean)} ({', '.join(a.control.sources)})"
    return [
        html.escape(a.attack),
        html.escape(a.metric.rsplit("/", 1)[-1]),
        html.escape(f"{a.data} / {a.protocol}"),
        html.escape(a.value.text()),
        html.escape(control),
        html.escape(difference_text(a.decision)),
        html.escape(number(a.decision.margin)),
        html.escape(WORDS[a.decision.verdict]),
        html.escape(stop),
        html.escape(per_defense(a) if a.leaks else "–"),
    ]


def sentence(attack: str, rows: list[Answer]) -> str:
    """One sentence on ``attack``: at how many places it leaks beyond its control undefended and where most, the
    cheapest setting shown to stop it there and its cost, and at how many leaking places one is shown; or how the places
    stand where it leaks nowhere."""
    leaking = [a for a in rows if a.leaks]
    most = max(leaking or rows, key=_leak_size)
    where = f"{most.data} / {most.protocol}"
    value = f"{number(most.value.mean)} against its control's {number(most.baseline)}"
    if not leaking:
        tally = {WORDS[v]: sum(a.decision.verdict is v for a in rows) for v in (Verdict.stopped, Verdict.undecided, Verdict.unknown)}
        counts = ", ".join(f"{n} {word}" for word, n in tally.items() if n)
        return (
            f"{attack} is shown to leak beyond its control at none of the {len(rows)} place(s) it was measured undefended "
            f"({counts}; nearest to a leak {where}: {value}, {difference_text(most.decision)})."
        )
    told = f"{attack} leaks beyond its control at {len(leaking)} of {len(rows)} place(s) undefended, most at {where} ({value})"
    stop = most.cheapest
    if stop is None:
        undecided = sum(s.decision.verdict is Verdict.undecided for s in most.settings)
        there = (
            f"no setting measured there is shown to stop it ({most.tried} tried, {undecided} undecided)"
            if most.tried
            else "no defense was measured there"
        )
    else:
        cost = "an unknown accuracy cost" if stop.cost is None else f"an accuracy cost of {number(stop.cost)}"
        there = f"the cheapest setting shown to stop it there is {stop.defense} ({stop.value.text()}, {cost})"
    stopped = sum(a.cheapest is not None for a in leaking)
    return f"{told}; {there}; a setting is shown to stop it at {stopped} of the {len(leaking)} leaking place(s)."


def _leak_size(a: Answer) -> float:
    """How far ``a`` lies beyond its control on the leaky side (negative where it falls short of it)."""
    return a.decision.mean if math.isfinite(a.decision.mean) else float("-inf")


def sentences_html(rows: list[Answer]) -> str:
    """One sentence per attack, as a list."""
    by_attack: dict[str, list[Answer]] = {}
    for a in rows:
        by_attack.setdefault(a.attack, []).append(a)
    items = "".join(f"<li>{html.escape(sentence(attack, found))}</li>" for attack, found in by_attack.items())
    return f"<ul class='sentences'>{items}</ul>"
