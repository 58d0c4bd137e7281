"""``fdattack report RUN_DIR [RUN_DIR ...] --out DIR``: a static HTML page that compares runs (the offline W&B dashboard).

The page opens with the runs, labeled by the config keys in which they differ; runs that differ only by their
seed are one entry, their mean over the seeds. Then a section per attack (and for the protocol's and the other
metrics): a final table with a row per run, each per-round metric plotted against the round (accuracy with its
chance line), the one-off metrics as a table, and each run's latest reconstruction grids with their row and column
labels. A metric with a 95 % interval (within the run, or across the seeds of a mean) shows it: ``[low, high]``
after its value in the tables, a shaded band around its line in the plots.
"""

from __future__ import annotations

import errno
import html
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

from fdattack.errors import ConfigError
from fdattack.report.figures import DEFAULT_NOTE, NOTES, copy_grid, grid_html, latest_grids, plot_metric, run_style
from fdattack.report.runs import Section, format_value, label_keys, load_runs, sections
from fdattack.statistics.intervals import HIGH, LOW
from fdattack.tracking.run_records import Run
from fdattack.tracking.summary import CHANCE, TABLES

#: What the report writes into ``--out``: name -> whether it is a folder.
WRITTEN = {"plots": True, "grids": True, "index.html": False}
TITLES = {metric: title for columns in TABLES for metric, title, _ in columns}
#: The look the report and the matrix page share: page, headings, tables.
BASE_STYLE = """
body{font-family:system-ui,'DejaVu Sans',sans-serif;margin:24px;color:#1a1a1a;font-size:15px;line-height:1.4}
h1{margin-top:0} h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:2em} h3{margin:1.4em 0 .5em}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.3em 0 1em;font-size:14px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}
"""
STYLE = (
    BASE_STYLE
    + """
th{background:#f4f4f4;white-space:normal} td.dir{text-align:left;white-space:normal;word-break:break-all;font-size:13px;min-width:10em}
th.run,td.run{text-align:left;white-space:normal;min-width:9em;max-width:28em}
.swatch{display:inline-block;width:14px;height:14px;border-radius:3px;margin-right:6px;vertical-align:-2px}
.plots{display:flex;flex-wrap:wrap;gap:20px}
.plots figure{flex:1 1 540px;max-width:680px;margin:0}
.plots img{width:100%;height:auto}
figcaption{font-size:14px;color:#444;margin-bottom:4px}
.cards{display:flex;flex-wrap:wrap;gap:28px}
.card h4{margin:0 0 6px;font-size:15px;font-weight:normal}
.grid{display:grid;gap:4px;align-items:center}
.grid .head{font-size:13px;font-weight:bold;text-align:center}
.grid .rowhead{font-size:13px;text-align:right;padding-right:6px;white-space:nowrap}
.tile{image-rendering:pixelated;background-repeat:no-repeat;outline:1px solid #ddd}
.note{font-size:13px;color:#555} .ci{color:#666;font-size:12px}
@media (max-width:900px){body{margin:12px}}
"""
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(value: Any, low: Any = None, high: Any = None) -> str:
    """A table cell of a value, with its interval ``[low, high]`` where it has a finite one of some width."""
    if value is None:
        return "<td>nan</td>"  # the run record writes NaN as null
    if not _is_number(value):
        return "<td>–</td>"
    interval = (
        f" <span class='ci'>[{low:.3g}, {high:.3g}]</span>"
        if _is_number(low) and _is_number(high) and math.isfinite(low) and math.isfinite(high) and low < high
        else ""
    )
    return f"<td>{value:.4g}{interval}</td>"


def _final_cell(run: Run, key: str) -> str:
    return _cell(run.final.get(key, ""), run.final.get(key + LOW), run.final.get(key + HIGH))


def _run_cell(runs: list[Run], i: int) -> str:
    colour, _ = run_style(i)
    return f"<td class='run'><span class='swatch' style='background:{colour}'></span>{html.escape(runs[i].label)}</td>"


def _last_round(run: Run) -> str:
    return "–" if run.last_round is None else str(run.last_round)


def _table(css: str, heads: Iterable[str], rows: Iterable[str]) -> str:
    """A table in a horizontally scrolling box; dotted and underscored headers may wrap at their separators."""
    head = "".join(
        f"<th{' class=run' if i == 0 else ''}>{html.escape(h).replace('.', '.<wbr>').replace('_', '_<wbr>')}</th>"
        for i, h in enumerate(heads)
    )
    return f"<div class='scroll'><table class='{css}'><tr>{head}</tr>{''.join(f'<tr>{row}</tr>' for row in rows)}</table></div>"


def _ordered(metrics: list[str]) -> list[str]:
    """The summary table's columns first (accuracy, SSIM, ..., chance), then the rest by name."""
    return sorted(metrics, key=lambda m: (list(TITLES).index(m) if m in TITLES else len(TITLES), m))


def runs_table(runs: list[Run], keys: list[str]) -> str:
    """A row per run: label, its value of every differing config key, last round and directory."""
    rows = [
        _run_cell(runs, i)
        + "".join(f"<td>{html.escape(format_value(run.config.get(k, '–')))}</td>" for k in keys)
        + f"<td>{_last_round(run)}</td><td class='dir'>{'<br>'.join(html.escape(str(p)) for p in run.replicas or [run.path])}</td>"
        for i, run in enumerate(runs)
    ]
    return _table("runs", ["run", *keys, "last round", "directory"], rows)


def final_table(runs: list[Run], section: Section) -> str:
    """Runs as rows, the section's per-round and other metrics as columns (last recorded values; the runs
    table gives each run's last round)."""
    metrics = _ordered(section.per_round + section.final)
    rows = [_run_cell(runs, i) + "".join(_final_cell(run, section.key(m)) for m in metrics) for i, run in enumerate(runs)]
    return _table(f"final section-{section.name}", ["run", *(TITLES.get(m, m) for m in metrics)], rows)


def final_heading(runs: list[Run]) -> str:
    """ "Final metrics" where every run ran to its end; else what the values are, naming the runs that did not finish."""
    unfinished = [run.label or str(run.path) for run in runs if not run.finished]
    if not unfinished:
        return "Final metrics"
    return html.escape(f"Last recorded metrics (not final: {', '.join(unfinished)} did not finish)")


def one_off_table(runs: list[Run], section: Section) -> str:
    """Runs as rows, the one-off metrics as columns, with the round they were recorded in."""
    rows = []
    for i, run in enumerate(runs):
        values = {m: run.series(section.key(m)) for m in section.one_off}
        recorded = sorted({points[0][0] for points in values.values() if points})
        rows.append(
            _run_cell(runs, i)
            + f"<td>{', '.join(map(str, recorded)) or '–'}</td>"
            + "".join(_final_cell(run, section.key(m)) for m in section.one_off)
        )
    return _table(f"oneoff section-{section.name}", ["run", "round", *section.one_off], rows)


def plots(runs: list[Run], section: Section, out: Path) -> str:
    """One SVG per per-round metric, in a wrapping row of figures."""
    figures = []
    for metric in _ordered(section.per_round):
        key = section.key(metric)
        level = f"{section.name}/{CHANCE.get(metric)}"
        chance = {
            i: float(run.final[level])
            for i, run in enumerate(runs)
            if metric in CHANCE and section.attack and run.series(key) and run.final.get(level) is not None
        }
        name = f"plots/{section.name.replace('/', '_')}__{metric}.svg"
        plot_metric(out / name, metric, runs, key, chance)
        note = f" · dashed grey line: chance ({', '.join(f'{c:.3g}' for c in sorted(set(chance.values())))})" if chance else ""
        band = " · shaded: 95 % interval" if any(run.series(key + LOW) for run in runs) else ""
        figures.append(
            f"<figure data-metric='{html.escape(key)}' data-chance='{int(bool(chance))}'>"
            f"<figcaption><b>{html.escape(TITLES.get(metric, metric))}</b> against the round{note}{band}</figcaption>"
            f"<img src='{name}' alt='{html.escape(key)} against the round'></figure>"
        )
    return f"<div class='plots'>{''.join(figures)}</div>"


def reconstructions(runs: list[Run], attack: str, out: Path) -> str:
    """Each run's latest grid of each kind, as labeled cards."""
    parts = []
    found = [latest_grids(run, attack) for run in runs]
    for kind in sorted({kind for grids in found for kind in grids}, key=lambda k: (k != "reconstructions", k)):
        cards = []
        for i, (run, grids) in enumerate(zip(runs, found)):
            if kind in grids:
                grid = grids[kind]
                colour, _ = run_style(i)
                cards.append(
                    f"<div class='card'><h4><span class='swatch' style='background:{colour}'></span>{html.escape(run.label)}"
                    f" · round {grid.round}</h4>{grid_html(grid, grid.labels(run, attack), copy_grid(grid, out, i))}</div>"
                )
        parts.append(
            f"<h3>{'Reconstructions' if kind == 'reconstructions' else html.escape(kind.capitalize())}, latest round</h3>"
            f"<p class='note'>{html.escape(NOTES.get(kind, DEFAULT_NOTE))}</p>"
            f"<div class='cards'>{''.join(cards)}</div>"
        )
    return "".join(parts)


def section_html(runs: list[Run], section: Section, out: Path) -> str:
    title = f"Attack {section.attack}" if section.attack else section.name.capitalize()
    parts = [f"<section id='{html.escape(section.name)}'><h2>{html.escape(title)}</h2>"]
    if section.per_round or section.final:
        parts.append(f"<h3>{final_heading(runs)}</h3>{final_table(runs, section)}")
    if section.per_round:
        parts.append(f"<h3>Against the round</h3>{plots(runs, section, out)}")
    if section.one_off:
        parts.append(f"<h3>Recorded once</h3>{one_off_table(runs, section)}")
    if section.attack:
        parts.append(reconstructions(runs, section.attack, out))
    parts.append("</section>")
    return "".join(parts)


def check_out(out: Path, written: dict[str, bool] = WRITTEN, option: str = "--out") -> None:
    """Refuse an ``--out`` that cannot take the report, before anything is written.

    Args:
        out: the folder of the page.
        written: what the page writes there, name -> whether it is a folder (:data:`WRITTEN` for the report).
        option: how the messages name ``out`` (the option that gave it).

    Raises:
        ConfigError: ``out`` is a file or under one, not writable, or holds a file where the report writes a folder (or
            the other way round).
    """
    existing = next(path for path in (out, *out.parents) if path.exists())
    if existing == out and not out.is_dir():
        raise ConfigError(f"{option} {out}: exists and is not a folder; give a folder for index.html and its plots")
    if not existing.is_dir():
        raise ConfigError(f"{option} {out}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {out}: {existing} is not writable")
    for name, folder in written.items():
        path = out / name
        if path.exists() and not (path.is_dir() if folder else path.is_file()):
            raise ConfigError(f"{option} {out}: {path} is in the way (the report writes its {name} {'folder' if folder else 'file'} there)")
        if path.exists() and not os.access(path, os.W_OK):
            raise ConfigError(f"{option} {out}: {path} is not writable")


def _render(runs: list[Run], keys: list[str], out: Path) -> None:
    """Write the page of ``runs`` (labeled by ``keys``) into the folder ``out``."""
    (out / "plots").mkdir()
    found = sections(runs)
    shown = label_keys(keys)
    differ = (
        f"Runs are labeled by the config keys in which they differ: {', '.join(html.escape(k) for k in shown)}."
        if keys
        else "The runs' configs do not differ (output_dir, name, resume and logger.* aside)."
    )
    implied = [k for k in keys if k not in shown]
    if implied:
        differ += f" The settings of the differing components differ too: {', '.join(html.escape(k) for k in implied)}."
    nav = " · ".join(f"<a href='#{html.escape(s.name)}'>{html.escape(s.name)}</a>" for s in found)
    page = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>fdattack report</title>",
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><style>{STYLE}</style></head><body>",
        f"<h1>fdattack report</h1><p>{len(runs)} run{'s' if len(runs) != 1 else ''}. {differ}</p>",
        f"<h2>Runs</h2>{runs_table(runs, shown)}<p class='note'>{nav}</p>",
        *(section_html(runs, section, out) for section in found),
        "</body></html>",
    ]
    (out / "index.html").write_text("\n".join(page))


def _replace_folder(source: Path, target: Path) -> None:
    """Put a copy of ``source`` in place of ``target``: copied beside it first, then swapped in (the old one deleted)."""
    fresh, old = target.with_name(f".{target.name}.new"), target.with_name(f".{target.name}.old")
    for leftover in (fresh, old):  # of an install cut short
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        shutil.copytree(source, fresh)
        if target.exists():
            target.rename(old)
        try:
            fresh.rename(target)
        except OSError:
            if old.exists():
                old.rename(target)  # the earlier page stays whole
            raise
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def _install(staging: Path, out: Path, written: dict[str, bool], option: str, replace: bool) -> None:
    """Copy the finished page from ``staging`` into ``out``: its folders first (merged into those there, or in place of
    them with ``replace``), ``index.html`` last.

    Raises:
        ConfigError: ``out`` refused a write that :func:`check_out` could not foresee.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, folder in written.items():
            if folder and (staging / name).is_dir():
                if replace:
                    _replace_folder(staging / name, out / name)
                else:
                    shutil.copytree(staging / name, out / name, dirs_exist_ok=True)
        shutil.copyfile(staging / "index.html", out / "index.html")
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # the machine's error, not the input's: the CLI says so
        raise ConfigError(f"{option} {out}: cannot write the report ({err.strerror or err})") from None


def write_staged(
    out: Path, render: Callable[[Path], None], written: dict[str, bool] = WRITTEN, option: str = "--out", replace: bool = False
) -> Path:
    """Build a page with ``render(folder)`` in a temporary folder, then install it into ``out`` once whole (its
    ``index.html`` last); returns ``out/index.html``. Call :func:`check_out` first.

    Args:
        out: the folder of the page.
        render: writes ``index.html`` and the ``written`` folders into the folder it is given.
        written: what the page writes, name -> whether it is a folder.
        option: how errors name ``out``.
        replace: the page's folders replace those in ``out`` (else they are merged, and files of earlier pages stay).

    Raises:
        ConfigError: ``out`` refused a write.
    """
    with tempfile.TemporaryDirectory(prefix="fdattack-report-") as staging:
        render(Path(staging))
        _install(Path(staging), out, written, option, replace)
    return out / "index.html"


def write_report(run_dirs: list[Path], out: Path) -> Path:
    """Write ``out/index.html`` (plots and grids in ``out/plots/`` and ``out/grids/``); returns its path.

    ``out`` and every run directory are checked first, and the page is built in a temporary folder and copied into
    ``out`` once whole, so a bad input leaves ``out`` as it was. A torn last line of a ``rounds.jsonl`` (a run killed
    while writing a round) is skipped with a warning (:func:`~fdattack.tracking.run_records.read_rounds`).

    Raises:
        ConfigError: ``out`` cannot take the report (:func:`check_out`).
        DataError: a folder that is not a run directory, or an unreadable ``rounds.jsonl`` (naming its line),
            ``metrics.json``, ``config.yaml`` or grid image.
    """
    check_out(out)
    runs, keys = load_runs(run_dirs)
    return write_staged(out, lambda staging: _render(runs, keys, staging))
