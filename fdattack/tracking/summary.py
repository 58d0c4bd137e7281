"""The end-of-run tables printed by ``fdattack run``: each attack's final scores next to their baselines, one table
per kind of attack (reconstruction, label distribution, membership, model inversion). A score with a 95 % interval
(``<metric>_ci_low`` and ``_ci_high`` beside it) prints as ``0.40 [0.12, 0.77]``."""

from __future__ import annotations

import math

from fdattack.statistics.intervals import HIGH, LOW
from fdattack.tracking.stopped_attacks import stopped_attacks

#: per kind of attack: (metric suffix under ``attack/<name>/``, column title, format); an attack is listed in the
#: first table whose first metric it reports, and in no other (model inversion comes before label distribution: VMI
#: logs a ``kl`` detail)
TABLES = (
    (
        ("accuracy", "accuracy", "{:.2f}"),
        ("ssim", "SSIM", "{:.3f}"),
        ("too_close_to_public", "too close to public", "{:.0f}"),
        ("eval_top1", "eval top-1", "{:.2f}"),
        ("chance", "chance", "{:.2f}"),
    ),
    (
        ("top1", "top-1", "{:.2%}"),
        ("top1_std", "top-1 std", "{:.2%}"),
        ("top5", "top-5", "{:.2%}"),
        ("top5_std", "top-5 std", "{:.2%}"),
        ("chance", "chance", "{:.2%}"),
        ("diversity", "diversity", "{:.3g}"),
        ("fid", "FID", "{:.4g}"),
        ("fid_images", "FID images", "{:.0f}"),
        ("feature_cosine", "feature cos.", "{:.3f}"),
        ("feature_cosine_noise", "noise cos.", "{:.3f}"),
        ("eval_classifier_accuracy", "eval classifier acc.", "{:.2%}"),
    ),
    (
        ("kl", "KL(p||p^)", "{:.3f}"),
        ("chebyshev", "Chebyshev", "{:.3f}"),
        ("random_kl", "random KL", "{:.3f}"),
        ("uniform_kl", "uniform KL", "{:.3f}"),
    ),
    (
        ("tpr_at_1pct_fpr", "TPR@1%FPR", "{:.2%}"),
        ("tpr_at_0.1pct_fpr", "TPR@0.1%FPR", "{:.2%}"),
        ("auc", "AUC", "{:.3f}"),
        ("balanced_accuracy", "balanced acc.", "{:.2%}"),
    ),
)

#: the chance level of each accuracy (an attack's ``attack/<name>/<chance metric>``): a dashed line on its plots
CHANCE = {"accuracy": "chance", "eval_top1": "chance", "top1": "chance", "top5": "chance_top5"}


def format_score(final: dict[str, float], key: str, fmt: str) -> str:
    """``final[key]`` in ``fmt``, followed by its interval ``[low, high]`` where ``final`` holds a finite one whose ends
    differ in ``fmt`` (a figure equal at every seed, such as chance, shows none); ``-`` if absent."""
    if key not in final:
        return "-"
    text = fmt.format(final[key])
    low, high = final.get(key + LOW), final.get(key + HIGH)
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high) and fmt.format(low) != fmt.format(high):
        text += f" [{fmt.format(low)}, {fmt.format(high)}]"
    return text


def attack_summary(final: dict[str, float]) -> str:
    """Fixed-width tables with a row per attack found in ``final`` (``attack/<name>/<metric>`` keys), then a line per
    attack that was stopped (its scores are none: :mod:`~fdattack.tracking.stopped_attacks`); "" if neither."""
    stopped = stopped_attacks(final)
    names = sorted({key.split("/")[1] for key in final if key.startswith("attack/") and key.count("/") == 2} - set(stopped))
    tables, placed = [], set()
    for columns in TABLES:
        listed = [name for name in names if f"attack/{name}/{columns[0][0]}" in final and name not in placed]
        if not listed:
            continue
        placed.update(listed)
        header = ["attack", *(title for _, title, _ in columns)]
        rows = [[name, *(format_score(final, f"attack/{name}/{metric}", fmt) for metric, _, fmt in columns)] for name in listed]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        tables.append(
            "\n".join(
                "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
                for row in [header, *rows]
            )
        )
    if stopped:
        tables.append("\n".join(f"{name}: stopped ({why}); no final score" for name, why in stopped.items()))
    return "\n\n".join(tables)
