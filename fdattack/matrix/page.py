"""The page of ``fdattack matrix``: a static ``index.html`` with PNG heatmaps and privacy–utility plots.

It reads the matrix as the dict of ``matrix.json`` (:func:`fdattack.matrix.outputs.to_json`). Per dataset: a heatmap per
attack headline metric (rows: protocols, columns: defenses; each cell the mean over the seeds and its 95 % interval
across them, on the scale of the metric's kind), the same numbers as a table, the utility metrics as tables, and per
protocol a privacy–utility plot (one point per defense, a line along a defense given at several strengths). Last,
every cell or attack that did not run, with its reason. The page is built in a temporary folder and installed whole
(:func:`fdattack.report.page.write_staged`); it loads nothing from the network.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fdattack.matrix.answer import answer_html, baseline_of
from fdattack.matrix.shown import Shown, cells_by_place, finite, lower_leaks, number, shown, utility_of
from fdattack.report.figures import run_style
from fdattack.report.page import BASE_STYLE, check_out, write_staged

#: What the page writes into its folder: name -> whether it is a folder.
WRITTEN = {"plots": True, "index.html": False}
#: Heatmap files are ``plots/heatmap__<data>__<metric>.png`` (``/`` of the metric as ``-``).
HEATMAP_PREFIX = "heatmap__"
#: The attack of a row of the not-run list that stands for the whole cell.
WHOLE_CELL = "whole cell"
#: The heatmaps' colour maps: more leakage is always the darker red; centred on a baseline, the baseline is white and
#: what leaks less than it blue.
CMAP, CMAP_REVERSED = "Reds", "Reds_r"
DIVERGING, DIVERGING_REVERSED = "RdBu_r", "RdBu"
STYLE = (
    BASE_STYLE
    + """
th{background:#f4f4f4} th.row,td.text{text-align:left;white-space:normal}
td.off{background:repeating-linear-gradient(45deg,#eee,#eee 4px,#ddd 4px,#ddd 8px);color:#555;text-align:center;cursor:help}
.ci{color:#666;font-size:12px} .note{font-size:13px;color:#555}
figure{margin:0 0 .5em} figure img{max-width:100%;height:auto} figcaption{font-size:14px;color:#444;margin-bottom:4px}
.legend{background:#f8f8f8;border:1px solid #ddd;padding:6px 12px;max-width:60em}
div.gallery{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start} div.gallery figure{max-width:200px}
div.gallery img{max-height:480px;width:auto;image-rendering:pixelated} div.gallery figcaption{font-size:12px} ul.sentences{max-width:70em}
@media (max-width:900px){body{margin:12px}}
"""
)
LEGEND = (
    "<ul><li>Each cell: the mean over the seeds, then <span class='ci'>[its 95 % interval across the seeds]</span> "
    "(none with one seed): Wilson-type for a rate, Student's t joined with a log-scale interval for a distance, Student's t "
    "otherwise, each seed's own within-run spread a floor under the seeds'.</li>"
    "<li><b>n/a</b>: the protocol or data cannot give what the attack or defense needs; <b>failed</b>: a seed failed; "
    "<b>incomplete</b>: seeds left to run; <b>–</b>: not recorded; <b>nan</b>: not a number. Hover a table cell for the "
    "reason.</li>"
    "<li>Heatmaps: the darker the red, the more leakage (for a distance to the truth such as <code>…/kl</code>, the lower "
    "the value); where the metric has a baseline (chance, the uniform guess, an AUC of 0.5) the colours are centred on it: "
    "white is the baseline, blue does worse than it, and <i>≈ baseline</i> marks a cell whose interval holds it.</li></ul>"
)


def grid(matrix: dict, data: str, metric: str) -> list[list[Shown]]:
    """``metric`` in every (protocol, defense) cell of ``data``: a row per protocol, a column per defense."""
    cells, axes = cells_by_place(matrix), matrix["axes"]
    return [[shown(cells.get((data, p, d)), metric) for d in axes["defenses"]] for p in axes["protocols"]]


def slug(text: str) -> str:
    """``text`` as part of a file name: ``/`` as ``-``, anything unusual as ``_``."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", text.replace("/", "-"))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _limits(means: list[float]) -> tuple[float, float]:
    """The colour scale: [0, 1] for values in it (rates, comparable across heatmaps), else their range."""
    if all(0.0 <= m <= 1.0 for m in means):
        return 0.0, 1.0
    low, high = min(means), max(means)
    return (low - 0.5, high + 0.5) if low == high else (low, high)


def colour_scale(means: list[float], baseline: float | None) -> tuple[float, float | None, float]:
    """A heatmap's (low, centre, high): centred on ``baseline`` where there is one (a cell at the baseline is white, and
    equal distances either side look alike), the range taking in the baseline and every value; else :func:`_limits`
    with no centre."""
    if baseline is None:
        low, high = _limits(means)
        return low, None, high
    reach = max([abs(m - baseline) for m in means] + [0.0]) or 0.5
    return baseline - reach, baseline, baseline + reach


def holds(cell: Shown, baseline: float | None) -> bool:
    """Whether ``cell``'s interval holds ``baseline`` (the attack is not shown to do better than it there)."""
    return baseline is not None and cell.low is not None and cell.high is not None and cell.low <= baseline <= cell.high


def draw_heatmap(
    path: Path, title: str, metric: str, rows: list[str], columns: list[str], table: list[list[Shown]], baseline: float | None = None
) -> None:
    """Write a PNG heatmap of ``table`` (rows x columns): each cell annotated ``mean\\n[low, high]`` (and ``≈ baseline``
    where its interval holds the ``baseline``), cells without a number grey and hatched with their word, and a colorbar;
    the colours centred on the baseline where there is one (:func:`colour_scale`), reversed for a lower-is-leakier
    ``metric``."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import Normalize, TwoSlopeNorm
    from matplotlib.patches import Rectangle

    plt = _pyplot()
    values = np.array([[np.nan if s.mean is None else s.mean for s in row] for row in table], dtype=float).reshape(len(rows), len(columns))
    low, centre, high = colour_scale([s.mean for row in table for s in row if s.mean is not None] or [0.0], baseline)
    if centre is None:
        cmap, norm = colormaps[CMAP_REVERSED if lower_leaks(metric) else CMAP], Normalize(low, high)
    else:
        cmap, norm = colormaps[DIVERGING_REVERSED if lower_leaks(metric) else DIVERGING], TwoSlopeNorm(centre, low, high)
    fig, ax = plt.subplots(figsize=(2.4 + 1.9 * len(columns), 1.3 + 0.85 * len(rows)))
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, aspect="auto")
    for i, row in enumerate(table):
        for j, cell in enumerate(row):
            if cell.mean is None:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="0.9", edgecolor="0.65", hatch="//", linewidth=0))
                ax.text(j, i, cell.word, ha="center", va="center", fontsize=10, color="0.2", backgroundcolor="0.9")
            else:
                r, g, b, _ = cmap(image.norm(cell.mean))
                ink = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
                label = cell.text("\n") + ("\n≈ baseline" if holds(cell, baseline) else "")
                ax.text(j, i, label, ha="center", va="center", fontsize=9, color=ink)
    ax.set_xticks(range(len(columns)), labels=columns)
    ax.set_yticks(range(len(rows)), labels=rows)
    ax.set_xlabel("defense")
    ax.set_ylabel("protocol")
    ax.set_title(title, fontsize=11)
    bar = fig.colorbar(image, ax=ax)
    bar.set_label(f"{metric}\n({'lower' if lower_leaks(metric) else 'higher'} = more leakage)", fontsize=9)
    if baseline is not None:
        bar.ax.axhline(baseline, color="black", linewidth=1)
        bar.ax.text(1.6, baseline, f"baseline {number(baseline)}", transform=bar.ax.get_yaxis_transform(), va="center", fontsize=8)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


@dataclass(frozen=True)
class Point:
    """A defense's cell in a privacy–utility plot: its utility (x, from metric ``x_key``) and leakage (y)."""

    defense: int
    name: str
    x: Shown
    y: Shown
    x_key: str


def tradeoff_points(matrix: dict, data: str, protocol: str, metric: str) -> list[Point]:
    """One point per defense of (``data``, ``protocol``) that has both a utility and ``metric`` as numbers."""
    cells, points = cells_by_place(matrix), []
    for i, defense in enumerate(matrix["axes"]["defenses"]):
        cell = cells.get((data, protocol, defense))
        key, x = utility_of(cell)
        y = shown(cell, metric)
        if x.mean is not None and y.mean is not None:
            points.append(Point(i, defense, x, y, key))
    return points


def curve_paths(points: list[Point], curves: dict[str, Any]) -> dict[str, list[Point]]:
    """Per curve of ``matrix.json`` (a defense at several strengths), its points in the order of its strengths; a curve
    with fewer than two points that have numbers draws no line."""
    by_name = {p.name: p for p in points}
    paths = {name: [by_name[s] for s, _ in curve.get("settings", []) if s in by_name] for name, curve in curves.items()}
    return {name: path for name, path in paths.items() if len(path) >= 2}


def _error(value: Shown) -> list[list[float]]:
    """Error-bar lengths below and above the mean from the interval (0 without one)."""
    assert value.mean is not None
    if value.low is None or value.high is None:
        return [[0.0], [0.0]]
    return [[max(0.0, value.mean - value.low)], [max(0.0, value.high - value.mean)]]


def _unit_axis(ax: Any, values: list[float], axis: str) -> None:
    """Rates (values in [0, 1]) on a [0, 1] axis, whatever their error bars' lengths."""
    if values and all(0.0 <= v <= 1.0 for v in values):
        (ax.set_xlim if axis == "x" else ax.set_ylim)(-0.05, 1.05)


def draw_tradeoff(
    path: Path,
    title: str,
    panels: dict[str, list[Point]],
    curves: dict[str, Any] | None = None,
    baselines: dict[str, float | None] | None = None,
) -> None:
    """Write a PNG with one subplot per attack metric (``panels``: metric -> its points): utility against leakage, one
    point per defense with error bars both ways from the intervals, labeled with the defense; the points of a defense
    given at several strengths (``curves``, from ``matrix.json``) joined by a line in the order of its strengths; the
    metric's baseline (chance, the uniform guess), where ``baselines`` has one, a dashed line."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4.0), squeeze=False, layout="constrained")
    for ax, (metric, points) in zip(axes[0], panels.items()):
        baseline = (baselines or {}).get(metric)
        if baseline is not None:
            ax.axhline(baseline, color="black", linestyle="--", linewidth=1, alpha=0.7)
            ax.annotate(f"baseline {number(baseline)}", (0.01, baseline), xycoords=("axes fraction", "data"), fontsize=8, va="bottom")
        for name, path_points in curve_paths(points, curves or {}).items():
            colour, _ = run_style(path_points[0].defense)
            ax.plot([p.x.mean for p in path_points], [p.y.mean for p in path_points], "-", color=colour, alpha=0.5, label=name)
        labels: dict[tuple[float, float], int] = {}  # labels at each position so far: equal points' labels stack up
        for k, p in enumerate(points):
            colour, _ = run_style(p.defense)
            size = 11 - 6 * k / max(len(points) - 1, 1)  # earlier points larger: equal points all stay visible
            assert p.x.mean is not None and p.y.mean is not None
            ax.errorbar(p.x.mean, p.y.mean, xerr=_error(p.x), yerr=_error(p.y), fmt="o", color=colour, capsize=3, markersize=size)
            above = labels[p.x.mean, p.y.mean] = labels.get((p.x.mean, p.y.mean), -1) + 1
            ax.annotate(p.name, (p.x.mean, p.y.mean), textcoords="offset points", xytext=(6, 6 + 12 * above), fontsize=9, color=colour)
        _unit_axis(ax, [p.x.mean for p in points if p.x.mean is not None], "x")
        _unit_axis(ax, [p.y.mean for p in points if p.y.mean is not None], "y")
        ax.set_xlabel(" / ".join(dict.fromkeys(p.x_key for p in points)) + " (utility)", fontsize=9)
        ax.set_ylabel(f"{metric}\n({'lower' if lower_leaks(metric) else 'higher'} = more leakage)", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def applicable_rows(protocols: list[str], table: list[list[Shown]]) -> tuple[list[str], list[list[Shown]]]:
    """The protocols and rows of ``table`` where the metric applies in at least one cell (a row of n/a says nothing the
    not-run list does not)."""
    kept = [i for i, row in enumerate(table) if not all(cell.word == "n/a" for cell in row)]
    return [protocols[i] for i in kept], [table[i] for i in kept]


def applicable_columns(defenses: list[str], table: list[list[Shown]]) -> tuple[list[str], list[list[Shown]]]:
    """The defenses and columns of ``table`` where the metric applies in at least one row (as :func:`applicable_rows`)."""
    kept = [j for j in range(len(defenses)) if not all(row[j].word == "n/a" for row in table)] if table else list(range(len(defenses)))
    return [defenses[j] for j in kept], [[row[j] for j in kept] for row in table]


def table_html(
    matrix: dict, metric: str, table: list[list[Shown]], protocols: list[str] | None = None, defenses: list[str] | None = None
) -> str:
    """``table`` as an HTML table (rows: ``protocols``, columns: ``defenses``, all of the matrix's by default); a cell
    without a number carries its reason in ``title``."""
    axes = matrix["axes"]
    columns = axes["defenses"] if defenses is None else defenses
    head = "<th class='row'>protocol \\ defense</th>" + "".join(f"<th>{html.escape(d)}</th>" for d in columns)
    rows = []
    for protocol, row in zip(axes["protocols"] if protocols is None else protocols, table):
        tds = []
        for cell in row:
            if cell.mean is None:
                tds.append(f"<td class='off' title='{html.escape(cell.reason)}'>{html.escape(cell.word)}</td>")
            else:
                interval = f"<span class='ci'> {html.escape(cell.interval())}</span>" if cell.interval() else ""
                tds.append(f"<td>{html.escape(number(cell.mean))}{interval}</td>")
        rows.append(f"<tr><th class='row'>{html.escape(protocol)}</th>{''.join(tds)}</tr>")
    return f"<div class='scroll'><table class='matrix' data-metric='{html.escape(metric)}'><tr>{head}</tr>{''.join(rows)}</table></div>"


def data_baseline(matrix: dict, data: str, metric: str) -> float | None:
    """The baseline of ``metric`` on ``data`` (:func:`~fdattack.matrix.answer.baseline_of`): that of the first
    of its cells that has one (chance depends on the data's targets, not on the protocol or the defense)."""
    cells = [c for (d, _, _), c in cells_by_place(matrix).items() if d == data]
    return next((b for b in (baseline_of(c, metric) for c in cells) if b is not None), None) if metric.startswith("attack/") else None


def heatmap_html(matrix: dict, data: str, metric: str, table: list[list[Shown]], out: Path) -> str:
    """The heatmap of ``metric``'s ``table`` over ``data``'s cells (written under ``out/plots/``), then the table."""
    name = f"plots/{HEATMAP_PREFIX}{slug(data)}__{slug(metric)}.png"
    axes = matrix["axes"]
    baseline = data_baseline(matrix, data, metric)
    protocols, table = applicable_rows(axes["protocols"], table)
    defenses, table = applicable_columns(axes["defenses"], table)
    draw_heatmap(out / name, f"{data}: {metric}", metric, protocols, defenses, table, baseline)
    direction = "lower" if lower_leaks(metric) else "higher"
    anchor = "" if baseline is None else f" · white = the baseline {number(baseline)}; ≈ baseline: the interval holds it"
    caption = f"<b>{html.escape(metric)}</b> · rows: protocols, columns: defenses · {direction} = more leakage{html.escape(anchor)}"
    return (
        f"<figure class='heatmap' data-metric='{html.escape(metric)}'><figcaption>{caption}</figcaption><img src='{html.escape(name)}' "
        f"alt='{html.escape(metric)} heatmap of {html.escape(data)}'></figure>{table_html(matrix, metric, table, protocols, defenses)}"
    )


def attack_html(matrix: dict, data: str, attack: str, out: Path) -> str:
    """An attack's heatmaps over ``data``; a note instead where it has no headline metric, or is n/a in every cell of
    ``data`` (with the reasons)."""
    metrics = (matrix.get("headline") or {}).get(attack) or []
    parts = [f"<h3>Attack {html.escape(attack)}</h3>"]
    if not metrics:
        parts.append("<p class='note'>No headline metric: the attack ran in no cell (see <a href='#not-run'>not run</a>).</p>")
    tables = {metric: grid(matrix, data, metric) for metric in metrics}
    shown_cells = [value for table in tables.values() for row in table for value in row]
    if shown_cells and all(value.word == "n/a" for value in shown_cells):
        reasons = "".join(f"<li>{html.escape(reason)}</li>" for reason in dict.fromkeys(value.reason for value in shown_cells))
        parts.append(f"<details class='note'><summary>n/a in every cell of {html.escape(data)}</summary><ul>{reasons}</ul></details>")
        return "".join(parts)
    parts += [heatmap_html(matrix, data, metric, table, out) for metric, table in tables.items()]
    return "".join(parts)


def tradeoff_html(matrix: dict, data: str, protocol: str, out: Path) -> str:
    """The privacy–utility plot of (``data``, ``protocol``): a subplot per attack's first headline metric."""
    headline = matrix.get("headline") or {}
    panels = {metrics[0]: tradeoff_points(matrix, data, protocol, metrics[0]) for metrics in headline.values() if metrics}
    panels = {metric: points for metric, points in panels.items() if points}
    title = f"{data} · {protocol}"
    if not panels:
        return f"<p class='note'>{html.escape(title)}: no attack metric with a utility to plot against.</p>"
    name = f"plots/tradeoff__{slug(data)}__{slug(protocol)}.png"
    baselines = {metric: data_baseline(matrix, data, metric) for metric in panels}
    draw_tradeoff(out / name, title, panels, matrix.get("curves"), baselines)
    return (
        f"<figure class='tradeoff' data-protocol='{html.escape(protocol)}'><figcaption><b>{html.escape(title)}</b>: "
        "utility against leakage, a point per defense (a line joins a defense's strengths), error bars: 95 % intervals across "
        "the seeds, dashed: the metric's baseline (chance, the uniform guess)</figcaption>"
        f"<img src='{html.escape(name)}' alt='privacy–utility of {html.escape(title)}'></figure>"
    )


def data_html(matrix: dict, data: str, out: Path) -> str:
    """A dataset's section: heatmaps per attack, utility tables, privacy–utility plots per protocol."""
    axes = matrix["axes"]
    parts = [f"<section id='data-{html.escape(slug(data))}'><h2>Data {html.escape(data)}</h2>"]
    parts += [attack_html(matrix, data, attack, out) for attack in axes["attacks"]]
    if matrix.get("utility"):
        parts.append("<h3>Utility</h3>")
        parts += [f"<h4>{html.escape(key)}</h4>{table_html(matrix, key, grid(matrix, data, key))}" for key in matrix["utility"]]
    parts.append("<h3>Privacy–utility</h3>")
    parts += [tradeoff_html(matrix, data, protocol, out) for protocol in axes["protocols"]]
    parts.append("</section>")
    return "".join(parts)


def not_run(matrix: dict) -> list[tuple[str, str, str, str]]:
    """(cell id, attack or :data:`WHOLE_CELL`, status, reason) of every cell that is not done and of every n/a or
    stopped attack."""
    rows = []
    for cell in matrix.get("cells", []):
        if cell.get("status") != "done":
            rows.append((cell["id"], WHOLE_CELL, str(cell.get("status")), cell.get("reason") or ""))
        rows += [(cell["id"], attack, "n/a", str(reason)) for attack, reason in (cell.get("not_applicable") or {}).items()]
        rows += [(cell["id"], attack, "stopped", f"a seed stopped it ({why})") for attack, why in (cell.get("stopped") or {}).items()]
    return rows


def not_run_html(matrix: dict) -> str:
    """The section listing what did not run, with its reason."""
    rows = not_run(matrix)
    if not rows:
        return "<section id='not-run'><h2>Not run</h2><p>Every attack ran in every cell.</p></section>"
    head = "".join(f"<th class='row'>{h}</th>" for h in ("cell", "attack", "status", "reason"))
    body = "".join("<tr>" + "".join(f"<td class='text'>{html.escape(text)}</td>" for text in row) + "</tr>" for row in rows)
    return (
        f"<section id='not-run'><h2>Not run</h2><details><summary>{len(rows)} cell(s) or attack(s) that did not run, each with "
        f"its reason</summary><div class='scroll'><table class='not-run'><tr>{head}</tr>{body}</table></div></details></section>"
    )


def header_html(matrix: dict) -> str:
    """Title, seeds, the axes and the legend."""
    axes = matrix["axes"]
    seeds = ", ".join(map(str, matrix.get("seeds", [])))
    listed = " · ".join(f"{axis}: {html.escape(', '.join(map(str, axes[axis])))}" for axis in ("data", "protocols", "defenses", "attacks"))
    nav = " · ".join(f"<a href='#data-{html.escape(slug(d))}'>{html.escape(d)}</a>" for d in axes["data"])
    return (
        f"<h1>Leakage matrix {html.escape(str(matrix.get('name', '')))}</h1>"
        f"<p>Seeds: {html.escape(seeds)} · from {html.escape(str(matrix.get('source', '')))}</p><p class='note'>{listed}</p>"
        f"<div class='legend'>{LEGEND}</div><p class='note'>{nav} · <a href='#not-run'>not run</a></p>"
    )


def comparisons_html(matrix: dict) -> str:
    """Each defense against no defense, seed by seed (``matrix.json``'s ``comparisons``): the surviving paired
    differences after Holm's correction over all of them, each with its interval and the seeds' values."""
    comparisons = matrix.get("comparisons")
    if not comparisons or not comparisons.get("rows"):
        return ""
    rows = comparisons["rows"]
    surviving = [r for r in rows if r["survives"]]
    head = (
        f"<h2>Against no defense, seed by seed</h2><p class='note'>Each defended cell against the undefended cell "
        f"(<code>{html.escape(rows[0]['baseline'])}</code>) of its data and protocol: the mean of the per-seed differences, "
        f"its {100 * (1 - comparisons['alpha']):.4g} % t interval and each seed's two values. {len(surviving)} of the "
        f"{comparisons['family_size']} comparisons made survive Holm's correction at a family-wise {comparisons['alpha']:g} "
        "(the rest are in <code>matrix.json</code>).</p>"
    )
    if not surviving:
        return head
    cells = "".join(
        "<tr>"
        + "".join(
            f"<td class='text'>{html.escape(str(v))}</td>"
            for v in (
                f"{r['data']} / {r['protocol']}",
                r["metric"],
                r["defense"],
                f"{r['mean']:+.3g} [{r['ci_low']:+.3g}, {r['ci_high']:+.3g}]",
                "; ".join(f"{s}: {b:.3g} → {v:.3g}" for s, b, v in zip(r["seeds"], r["baseline_values"], r["values"])),
                f"{r['p_holm']:.2g}",
            )
        )
        + "</tr>"
        for r in surviving
    )
    header = "".join(f"<th>{t}</th>" for t in ("data / protocol", "metric", "defense", "difference", "seed: none → defended", "Holm p"))
    return f"{head}<table><tr>{header}</tr>{cells}</table>"


def render(matrix: dict, out: Path, images_from: Path | None = None) -> None:
    """Write ``index.html`` and ``plots/`` of ``matrix`` into the folder ``out`` (the cells' images, where
    ``images_from`` holds them, copied beside the answer)."""
    (out / "plots").mkdir()
    page = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(str(matrix.get('name', '')))} · leakage matrix</title>",
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><style>{STYLE}</style></head><body>",
        header_html(matrix),
        answer_html(matrix, out, images_from),
        comparisons_html(matrix),
        *(data_html(matrix, data, out) for data in matrix["axes"]["data"]),
        not_run_html(matrix),
        "</body></html>",
    ]
    (out / "index.html").write_text("\n".join(page))


#: The columns of the W&B summary's ``matrix`` table: a row per cell and metric, and per cell or attack that did not run.
MATRIX_COLUMNS = ("data", "protocol", "defense", "attack", "metric", "mean", "ci_low", "ci_high", "seeds", "status", "reason")


def matrix_rows(matrix: dict) -> list[list[Any]]:
    """The rows of the W&B summary's ``matrix`` table (:data:`MATRIX_COLUMNS`; NaN as None).

    First a row per cell that is not done and per attack that is n/a in a cell (``metric`` empty, with the reason),
    then a row per cell and headline or utility metric it recorded (``attack`` empty for a utility metric).
    """
    cells = {c["id"]: c for c in matrix.get("cells", [])}
    rows: list[list[Any]] = []
    for cell_id, attack, status, reason in not_run(matrix):
        cell = cells[cell_id]
        attack = "" if attack == WHOLE_CELL else attack
        rows.append(
            [cell["data"], cell["protocol"], cell["defense"], attack, "", None, None, None, len(cell.get("seeds") or []), status, reason]
        )
    keys = [*(key for metrics in (matrix.get("headline") or {}).values() for key in metrics), *(matrix.get("utility") or [])]
    for cell in matrix.get("cells", []):
        for key in keys:
            values = (cell.get("metrics") or {}).get(key)
            if values is not None:
                attack = key.split("/")[1] if key.startswith("attack/") else ""
                numbers = [finite(values.get(k)) for k in ("mean", "ci_low", "ci_high")]
                where = [cell["data"], cell["protocol"], cell["defense"]]
                rows.append(
                    [*where, attack, key, *numbers, len(cell.get("seeds") or []), str(cell.get("status")), cell.get("reason") or ""]
                )
    return rows


def write_matrix_page(matrix: dict, out: Path, images_from: Path | None = None) -> Path:
    """Write ``out/index.html`` and its PNGs in ``out/plots/`` (replacing an earlier page's); returns the page's path.

    The page is built in a temporary folder and installed once whole, so a failure leaves ``out`` as it was.

    Args:
        matrix: the content of ``matrix.json``.
        out: the page's folder (created where missing).
        images_from: the matrix's root, where the cells' ``images`` are (None: the page shows none).

    Raises:
        ConfigError: ``out`` cannot take the page (a file in the way, not writable).
    """
    check_out(out, WRITTEN, "page folder")
    return write_staged(out, lambda staging: render(matrix, staging, images_from), WRITTEN, "page folder", replace=True)
