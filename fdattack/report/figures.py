"""The figures of ``fdattack report``: a metric against the round (SVG), and labeled reconstruction grids (HTML).

Every run keeps one colour in every plot and in the runs table. Legends sit below the axes, so they
hide no data however many runs there are; accuracy plots carry a dashed grey chance line.
"""

from __future__ import annotations

import html
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from fdattack.errors import CheckpointError, DataError
from fdattack.statistics.intervals import HIGH, LOW
from fdattack.tracking.checkpoint import load_checkpoint
from fdattack.tracking.run_records import Run

LINESTYLES = ("-", "--", ":", "-.")
#: Smallest displayed side of one reconstruction tile, in CSS pixels (tiles scale up by whole factors).
TILE_PX = 96
#: Rows of a reconstruction grid shown on the page (the full grid is linked).
MAX_ROWS = 16
#: Column titles per grid kind (the image name's ``attack_<name>_<kind>_round_XXXX.png``); a kind not listed here
#: (``inversions``) has square tiles and a column per sample.
COLUMNS = {"reconstructions": ("reconstruction", "private mean", "public mean"), "prior": ("prior", "private mean", "public mean")}
#: What a row of a grid kind shows, under its heading on the page.
NOTES = {"inversions": "A row per target label, a column per sample (the first evaluation.inversion.grid_samples)."}
DEFAULT_NOTE = "A row per target: the attack's image, then the private and public means of its label."


def run_style(index: int) -> tuple[str, str]:
    """(colour as #rrggbb, matplotlib line style) of the ``index``-th run: ten colours, then a new line style."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    return to_hex(colormaps["tab10"](index % 10)), LINESTYLES[index // 10 % len(LINESTYLES)]


def plot_metric(path: Path, metric: str, runs: list[Run], key: str, chance: dict[int, float]) -> None:
    """Write an SVG of ``key`` against the round, one line per run, shaded by its 95 % interval where the run recorded
    ``key_ci_low`` and ``key_ci_high`` (``id="band<run>"`` in the SVG); ``chance`` (run index -> level) draws dashed
    grey lines (one per distinct level, ``id="chance..."``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for i, run in enumerate(runs):
        points = run.series(key)
        if points:
            colour, style = run_style(i)
            thick = 1 - i / max(len(runs) - 1, 1)  # earlier runs wider, so runs with equal values all stay visible
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                color=colour,
                linestyle=style,
                marker="o",
                linewidth=1.5 + 3 * thick,
                markersize=4 + 6 * thick,
                label=run.label,
            )
            low, high = dict(run.series(key + LOW)), dict(run.series(key + HIGH))
            rounds = [r for r, _ in points if r in low and r in high]
            if rounds:
                ax.fill_between(
                    rounds, [low[r] for r in rounds], [high[r] for r in rounds], color=colour, alpha=0.18, linewidth=0, gid=f"band{i}"
                )
    for j, level in enumerate(sorted(set(chance.values()))):
        ax.axhline(level, color="0.45", linestyle=(0, (6, 3)), linewidth=1.4, label=f"chance = {level:.3g}", gid=f"chance{j}")
    if chance:
        ax.set_ylim(-0.03, 1.03)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    labels = ax.get_legend_handles_labels()[1]
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1 if max(map(len, labels), default=0) > 32 else 2, frameon=False)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: crisp at any width, searchable
        fig.savefig(path, format="svg", bbox_inches="tight")
    plt.close(fig)


@dataclass
class Grid:
    """The latest grid PNG of one kind (``reconstructions``, ``prior``) of one attack in one run."""

    kind: str
    round: int
    image: Path

    def labels(self, run: Run, attack: str) -> list[str] | None:
        """The target label of each row, from ``artifacts/<attack>_<kind>_round_XXXX.pt`` (None without it)."""
        artifact = run.path / "artifacts" / f"{attack}_{self.kind}_round_{self.round:04d}.pt"
        try:
            labels = load_checkpoint(artifact).get("labels") if artifact.is_file() else None
        except CheckpointError:
            return None
        return [str(int(y)) for y in labels] if isinstance(labels, torch.Tensor) else None


def latest_grids(run: Run, attack: str) -> dict[str, Grid]:
    """kind -> the grid of the latest round the run saved one for ``attack``."""
    pattern = re.compile(rf"attack_{re.escape(attack)}_([a-z]+)_round_(\d+)\.png")
    grids: dict[str, Grid] = {}
    for image in (run.path / "images").glob(f"attack_{attack}_*_round_*.png"):
        match = pattern.fullmatch(image.name)
        if match and (match.group(1) not in grids or grids[match.group(1)].round < int(match.group(2))):
            grids[match.group(1)] = Grid(match.group(1), int(match.group(2)), image)
    return grids


def grid_html(grid: Grid, labels: list[str] | None, src: str) -> str:
    """The grid as a labeled CSS grid of tiles cut from ``src`` (the copied PNG), each scaled up by a whole
    factor with pixelated rendering: a header row (target, then the kind's columns: reconstruction, private
    mean, public mean; or sample 1, 2, ...) and one row per target, labeled with its label.

    Raises:
        DataError: the grid PNG is not a readable image.
    """
    try:
        with Image.open(grid.image) as image:
            width, height = image.size
    except (OSError, Image.DecompressionBombError) as err:  # PIL's UnidentifiedImageError is an OSError without strerror
        reason = (err.strerror if isinstance(err, OSError) else str(err)) or "cannot identify image file"
        raise DataError(f"{grid.image}: not a readable image ({reason})") from None
    heads = COLUMNS.get(grid.kind)
    if heads is None:  # a column per sample, square tiles
        rows = len(labels) if labels else 1
        heads = tuple(f"sample {c + 1}" for c in range(max(1, width // (height // rows))))
    else:
        rows = len(labels) if labels else max(1, height // (width // len(heads)))
    columns = len(heads)
    scale = max(1, math.ceil(TILE_PX / (width // columns)))
    w, h = width // columns * scale, height // rows * scale
    cells = [f"<div class='head'>{html.escape(head)}</div>" for head in ("target", *heads)]
    for r in range(min(rows, MAX_ROWS)):
        name = f"label {labels[r]}" if labels else f"row {r + 1}"
        cells.append(f"<div class='rowhead'>{html.escape(name)}</div>")
        cells += [
            f"<div class='tile' style='width:{w}px;height:{h}px;background-image:url(\"{src}\");"
            f"background-size:{columns * w}px {rows * h}px;background-position:-{c * w}px -{r * h}px'></div>"
            for c in range(columns)
        ]
    more = f"<p class='note'>first {MAX_ROWS} of {rows} targets; <a href='{src}'>full grid</a></p>" if rows > MAX_ROWS else ""
    return f"<div class='grid' style='grid-template-columns:auto repeat({columns}, {w}px)'>{''.join(cells)}</div>{more}"


def copy_grid(grid: Grid, out: Path, run_index: int) -> str:
    """Copy the grid PNG under ``out/grids/``; returns its path relative to ``out``."""
    target = Path("grids") / f"run{run_index + 1}_{grid.image.name}"
    (out / "grids").mkdir(exist_ok=True)
    shutil.copyfile(grid.image, out / target)
    return target.as_posix()
