"""``fdattack report RUN_DIR [RUN_DIR ...] --out DIR``: a static HTML page, the offline W&B dashboard.

Per attack metric, one plot against the round with a line per (run, attack); the final metrics table;
and each run's last reconstruction grids.
"""

from __future__ import annotations

import html
import json
import shutil
from collections import defaultdict
from pathlib import Path

from omegaconf import OmegaConf

from fdattack.errors import DataError


def _load_run(run_dir: Path) -> tuple[str, list[dict], dict]:
    """(label, rounds, final metrics) of a run directory."""
    rounds_path, metrics_path = run_dir / "rounds.jsonl", run_dir / "metrics.json"
    if not rounds_path.is_file():
        raise DataError(f"{run_dir}: not an fdattack run directory (no rounds.jsonl)")
    try:
        rounds = [json.loads(line) for line in rounds_path.read_text().splitlines() if line.strip()]
        final = json.loads(metrics_path.read_text()) if metrics_path.is_file() else (rounds[-1] if rounds else {})
    except json.JSONDecodeError as err:
        raise DataError(f"{run_dir}: corrupt run record ({err})") from None
    label = run_dir.name
    if (run_dir / "config.yaml").is_file():
        cfg = OmegaConf.load(run_dir / "config.yaml")
        label = f"{cfg.get('name', run_dir.name)} [{cfg.protocol.name}] ({run_dir.name})"
    return label, rounds, final


def write_report(run_dirs: list[Path], out: Path) -> Path:
    """Write ``out/index.html`` (plots as PNGs beside it); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    runs = [(d, *_load_run(d)) for d in run_dirs]
    out.mkdir(parents=True, exist_ok=True)
    series: dict[str, list[tuple[str, list[int], list[float]]]] = defaultdict(list)
    for _, label, rounds, _ in runs:
        keys = sorted({k for r in rounds for k in r if k.startswith("attack/") or k.startswith("protocol/client_acc_mean")})
        for key in keys:
            points = [(r["round"], r[key]) for r in rounds if r.get(key) is not None]
            if points and not key.endswith("/chance"):
                metric = key.split("/")[-1] if key.startswith("attack/") else key
                name = key.split("/")[1] if key.startswith("attack/") else "protocol"
                series[metric].append((f"{name}: {label}", [p[0] for p in points], [p[1] for p in points]))
    parts = ["<html><head><meta charset='utf-8'><title>fdattack report</title>",
             "<style>body{font-family:sans-serif;margin:2em} table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:3px 8px}"
             " img.grid{image-rendering:pixelated;width:600px}</style></head><body><h1>fdattack report</h1>"]
    parts.append("<h2>Metrics against the round</h2>")
    for metric, lines in sorted(series.items()):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for label, xs, ys in lines:
            ax.plot(xs, ys, marker="o", label=label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel(metric)
        ax.legend(fontsize=7)
        fig.tight_layout()
        png = f"plot_{metric.replace('/', '_')}.png"
        fig.savefig(out / png, dpi=100)
        plt.close(fig)
        parts.append(f"<h3>{html.escape(metric)}</h3><img src='{png}'>")
    keys = sorted({k for *_, final in runs for k in final if k.startswith(("attack/", "protocol/"))})
    parts.append("<h2>Final metrics</h2><table><tr><th>metric</th>" + "".join(f"<th>{html.escape(label)}</th>" for _, label, _, _ in runs) + "</tr>")
    for key in keys:
        cells = "".join(f"<td>{final[key]:.4g}</td>" if isinstance(final.get(key), (int, float)) else "<td></td>" for *_, final in runs)
        parts.append(f"<tr><td>{html.escape(key)}</td>{cells}</tr>")
    parts.append("</table><h2>Last reconstructions</h2><p>A row per target: reconstruction, private mean, public mean.</p>")
    for i, (run_dir, label, rounds, _) in enumerate(runs):
        last = max((r["round"] for r in rounds), default=0)
        for grid in sorted((run_dir / "images").glob(f"attack_*_round_{last:04d}.png")):
            target = f"run{i}_{grid.name}"
            shutil.copyfile(grid, out / target)
            parts.append(f"<h3>{html.escape(label)}: {html.escape(grid.stem)}</h3><img class='grid' src='{target}'>")
    parts.append("</body></html>")
    index = out / "index.html"
    index.write_text("\n".join(parts))
    return index
