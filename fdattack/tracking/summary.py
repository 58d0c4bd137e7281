"""The end-of-run table printed by ``fdattack run``: each attack's final scores next to chance."""

from __future__ import annotations

#: (metric suffix under ``attack/<name>/``, column title, format)
COLUMNS = (
    ("accuracy", "accuracy", "{:.2f}"),
    ("ssim", "SSIM", "{:.3f}"),
    ("too_close_to_public", "too close to public", "{:.0f}"),
    ("eval_top1", "eval top-1", "{:.2f}"),
    ("chance", "chance", "{:.2f}"),
)


def attack_summary(final: dict[str, float]) -> str:
    """A fixed-width table with a row per attack found in ``final`` (``attack/<name>/<metric>`` keys); "" if none."""
    names = sorted({key.split("/")[1] for key in final if key.startswith("attack/") and key.count("/") == 2})
    if not names:
        return ""
    header = ["attack", *(title for _, title, _ in COLUMNS)]
    rows = [[name, *(fmt.format(final[f"attack/{name}/{metric}"]) if f"attack/{name}/{metric}" in final else "-"
                     for metric, _, fmt in COLUMNS)] for name in names]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
                     for row in [header, *rows])
