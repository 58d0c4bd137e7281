"""The leakage matrix's summary run on W&B: the whole matrix as one table and its heatmaps, beside its cells' runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fdattack.matrix.page import MATRIX_COLUMNS, matrix_rows
from fdattack.tracking.wandb_run import WandbRun

#: The job type of the matrix's summary run (a run of one of its cells: ``matrix-cell``).
MATRIX_JOB_TYPE = "matrix-summary"


def log_matrix_summary(wandb_cfg: Any, root: Path, matrix: dict, plots: list[Path]) -> Path | None:
    """Log the matrix's summary run: the ``matrix`` table (:func:`~fdattack.matrix.page.matrix_rows`) and each
    heatmap as ``matrix/<file stem>``.

    The run is ``<name>-summary`` in the group of the matrix's cells (the matrix's name), job type
    :data:`MATRIX_JOB_TYPE`, tagged ``matrix`` and ``logger.wandb.tags``; its mode is resolved as for any run
    (:meth:`~fdattack.tracking.wandb_run.WandbRun.start`: offline without credentials, nothing at all when disabled).

    Args:
        wandb_cfg: the ``logger.wandb`` node (mode, project, entity, tags, init_timeout_s; name, group and job_type unused).
        root: the matrix's folder; W&B writes ``root/wandb/``.
        matrix: the content of ``matrix.json``.
        plots: the heatmap PNGs (the page's ``plots/heatmap__*.png``).

    Returns:
        The run's folder under ``root/wandb/``; None when disabled.

    Raises:
        ConfigError: as :meth:`~fdattack.tracking.wandb_run.WandbRun.start`.
    """
    name = str(matrix["name"])
    identity = {
        "name": f"{name}-summary",
        "group": name,
        "job_type": MATRIX_JOB_TYPE,
        "tags": list(dict.fromkeys(["matrix", *(str(t) for t in (wandb_cfg.tags or []))])),
    }
    config = {key: matrix.get(key) for key in ("name", "source", "seeds", "axes", "headline", "utility")}
    with WandbRun.start(wandb_cfg, root, config, identity=identity) as run:
        run.log_tables({"matrix": (MATRIX_COLUMNS, matrix_rows(matrix))}, {f"matrix/{Path(p).stem}": Path(p) for p in plots})
    return run.directory
