"""The local run record: one run = one directory (DESIGN.md, "Contracts").

``output_dir/`` holds ``config.yaml`` (the resolved config), ``rounds.jsonl`` (one JSON object per
completed round), ``metrics.json`` (final flat metrics), ``images/``, ``checkpoints/`` and W&B's
``wandb/``. Only the writer (rank 0) touches the disk; on other ranks every method is a no-op.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fdattack.errors import CheckpointError
from fdattack.tracking.checkpoint import CheckpointDir, atomic_write

#: Top-level config keys that may differ between a run and its resumption.
RESUME_FREE_KEYS = ("resume", "output_dir", "logger.progress", "logger.level")


def to_jsonable(value: Any) -> Any:
    """Convert tensors, numpy values and nested containers to JSON types; NaN and +-inf become None."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value.item() if value.numel() == 1 else value.tolist()
    elif isinstance(value, (np.ndarray, np.generic)):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    raise TypeError(f"cannot record a {type(value).__name__} in JSON: {value!r}")


def _comparable(cfg: DictConfig) -> dict:
    """The plain config tree without the keys that may change on resume."""
    tree = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    if not isinstance(tree, dict):
        return {}
    for key in RESUME_FREE_KEYS:
        node: Any = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return tree


def _first_difference(old: Any, new: Any, prefix: str = "") -> str | None:
    """Dotted key of the first difference between two plain config trees (None when equal)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            name = f"{prefix}{key}"
            if key not in old or key not in new:
                return name
            found = _first_difference(old[key], new[key], name + ".")
            if found is not None:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            found = _first_difference(a, b, f"{prefix}{i}.")
            if found is not None:
                return found
        return None
    both_nan = isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new)
    same = (old == new and type(old) is type(new)) or both_nan
    return None if same else prefix.rstrip(".") or "<root>"


class RunDirectory:
    """Files of one run.

    Args:
        path: the run directory (``output_dir``).
        is_writer: True on the process that writes (rank 0); False makes every write a no-op.
        keep_checkpoints: how many round checkpoints :attr:`checkpoints` keeps.
    """

    def __init__(self, path: Path, is_writer: bool = True, keep_checkpoints: int = 2) -> None:
        self.path = Path(path)
        self.is_writer = is_writer
        self.keep_checkpoints = keep_checkpoints
        self._resuming = False

    @property
    def checkpoints(self) -> CheckpointDir:
        """Round checkpoints under ``checkpoints/`` (readable on every rank, written by the writer)."""
        return CheckpointDir(self.path / "checkpoints", self.keep_checkpoints, writable=self.is_writer)

    @property
    def config_path(self) -> Path:
        """``config.yaml``."""
        return self.path / "config.yaml"

    @property
    def rounds_path(self) -> Path:
        """``rounds.jsonl``."""
        return self.path / "rounds.jsonl"

    @property
    def metrics_path(self) -> Path:
        """``metrics.json``."""
        return self.path / "metrics.json"

    def prepare(self, resume: bool) -> None:
        """Create the directory, or check that it may be resumed.

        Raises:
            CheckpointError: without ``resume`` the folder exists and is not empty (nothing in it is
                touched); with ``resume`` it holds no checkpoint.
        """
        if not self.is_writer:
            return
        if self.path.exists() and not self.path.is_dir():
            raise CheckpointError(f"output_dir {self.path} exists and is not a folder; choose another output_dir")
        if resume:
            if self.checkpoints.latest() is None:
                raise CheckpointError(f"output_dir {self.path} has no checkpoint to resume from (no checkpoints/round_*.pt); "
                                      "run without resume=true in a new output_dir")
        elif self.path.is_dir() and any(self.path.iterdir()):
            raise CheckpointError(f"output_dir {self.path} is not empty; pass resume=true to continue it or choose another output_dir")
        self._resuming = resume
        for sub in ("checkpoints", "images"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)

    def write_config(self, cfg: DictConfig) -> None:
        """Write the resolved config to ``config.yaml``; on resume check it matches the stored one.

        Raises:
            CheckpointError: resuming with a config that differs from the stored one in a key other
                than ``resume`` and ``output_dir``; the first differing key is named.
        """
        if not self.is_writer:
            return
        new = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
        if self._resuming and self.config_path.is_file():
            try:
                old = OmegaConf.load(self.config_path)
            except Exception as err:  # yaml and OmegaConf errors alike
                raise CheckpointError(f"{self.config_path}: unreadable stored config ({str(err).splitlines()[0]}); "
                                      "restore it or choose another output_dir") from None
            key = _first_difference(_comparable(old), _comparable(new))
            if key is not None:
                stored, given = OmegaConf.select(old, key), OmegaConf.select(new, key)
                raise CheckpointError(f"{self.config_path}: cannot resume, config key '{key}' differs from the stored run "
                                      f"(stored {stored!r}, given {given!r}); resume with the same config or choose another output_dir")
            return
        text = OmegaConf.to_yaml(new)
        atomic_write(self.config_path, lambda handle: handle.write(text.encode()))

    def append_round(self, record: dict) -> None:
        """Append one completed round to ``rounds.jsonl`` (flushed and fsynced)."""
        if not self.is_writer:
            return
        line = json.dumps(to_jsonable(record), allow_nan=False)
        with open(self.rounds_path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def truncate_rounds(self, last_round: int) -> None:
        """Drop the lines of rounds after ``last_round`` (and a torn last line) from ``rounds.jsonl``."""
        if not self.is_writer or not self.rounds_path.is_file():
            return
        kept: list[str] = []
        for line in self.rounds_path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and int(row.get("round", 0)) <= last_round:
                kept.append(line + "\n")
        atomic_write(self.rounds_path, lambda handle: handle.write("".join(kept).encode()))

    def write_metrics(self, metrics: dict) -> None:
        """Atomically write ``metrics.json`` (sorted keys, indent 2; NaN/inf as null)."""
        if not self.is_writer:
            return
        text = json.dumps(to_jsonable(metrics), sort_keys=True, indent=2, allow_nan=False) + "\n"
        atomic_write(self.metrics_path, lambda handle: handle.write(text.encode()))

    def image_path(self, name: str, round: int) -> Path:
        """``images/<name>_round_0003.png`` (the name should not contain ``/``)."""
        return self.path / "images" / f"{name}_round_{round:04d}.png"
