"""Who a folder belongs to, for the commands that must not write into another's: a matrix's root, a seeds aggregate's
folder, a run's directory.

A matrix marks its root when it first writes there (:data:`MATRIX_MARKER`, naming the matrix); ``fdattack matrix``
refuses a root that is another matrix's, a seeds aggregate's or a run's, and ``fdattack run`` refuses an
``output_dir`` that is a matrix's root, so that neither writes its outputs over or beside the other's (issue 57). A
root made before the marker existed is known by its ``matrix.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from fdattack.errors import CheckpointError
from fdattack.tracking.checkpoint import atomic_write
from fdattack.tracking.results import stored_config

#: the file that marks a matrix's root: ``{"matrix": <name>}``
MATRIX_MARKER = ".fdattack-matrix.json"
#: what a run or a seeds aggregate writes at the top of its folder
RUN_FILES = ("metrics.json", "config.yaml", "rounds.jsonl")


def matrix_of(folder: Path) -> str | None:
    """The name of the matrix whose root ``folder`` is (its marker's, or an older root's ``matrix.json``'s; ``"?"`` where
    that cannot be read), or None where it is none's."""
    for name, key in ((MATRIX_MARKER, "matrix"), ("matrix.json", "name")):
        path = folder / name
        if path.is_file():
            try:
                return str(json.loads(path.read_text())[key])
            except (OSError, ValueError, KeyError, TypeError):
                return "?"
    return None


def run_results_in(folder: Path) -> str | None:
    """``"a seeds aggregate"`` or ``"a run's results"`` where ``folder`` holds one (by its ``config.yaml``'s ``seeds``),
    None where it holds neither."""
    if not (folder / "checkpoints").is_dir() and not any((folder / name).is_file() for name in RUN_FILES):
        return None
    try:
        seeds = stored_config(folder).get("seeds")
    except CheckpointError:
        seeds = None
    return "a seeds aggregate" if seeds is not None and not (folder / "checkpoints").is_dir() else "a run's results"


def mark_matrix_root(folder: Path, name: str) -> None:
    """Mark ``folder`` as matrix ``name``'s root (created if missing; the same marker again where it is one)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"matrix": name}) + "\n"
    if not (folder / MATRIX_MARKER).is_file() or (folder / MATRIX_MARKER).read_text() != text:
        atomic_write(folder / MATRIX_MARKER, lambda handle: handle.write(text.encode()))
