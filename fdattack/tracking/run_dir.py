"""The local run record: one run = one directory (DESIGN.md, "Contracts").

``output_dir/`` holds ``config.yaml`` (the resolved config), ``rounds.jsonl`` (one JSON object per
completed round), ``metrics.json`` (final flat metrics), ``images/``, ``checkpoints/`` and W&B's
``wandb/``. Only the writer (rank 0) touches the disk; on other ranks every method is a no-op.

A run holds an exclusive lock on ``.fdattack.lock`` in the directory from its pre-flight to its end
(:meth:`RunDirectory.claim`), so a second run on the same directory stops at once. The lock is an
``flock``: the OS drops it when the process ends, however it ends, so a killed run leaves no stale lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fdattack.errors import CheckpointError
from fdattack.tracking.checkpoint import CheckpointDir, atomic_write, load_checkpoint
from fdattack.tracking.folder_owner import matrix_of
from fdattack.tracking.results import check_made_with, result_tree

log = logging.getLogger("fdattack")

#: The lock file; its presence also marks a directory that an fdattack run has used.
LOCK_NAME = ".fdattack.lock"
#: What fdattack writes at the top of a run directory: only these are cleared when a stranded run restarts.
#: Written when a signal stops the run (:mod:`fdattack.tracking.exit_record`); removed when the run is resumed.
EXIT_NAME = "exit.json"
#: Where the run ran: a list with an entry per start (the first, then each resume), see :meth:`RunDirectory.record_machine`.
MACHINE_NAME = "machine.json"
OWN_FILES = frozenset({LOCK_NAME, EXIT_NAME, MACHINE_NAME, "config.yaml", "partition.json", "rounds.jsonl", "metrics.json"})
OWN_FOLDERS = frozenset({"checkpoints", "attack_state", "images", "artifacts", "wandb"})
#: What every round checkpoint holds (``config_fingerprint`` too since issue 30, ``attacks`` where attacks ran).
CHECKPOINT_KEYS = ("round", "protocol", "rng", "elapsed_s", "wandb_id")


def _is_own(entry: Path) -> bool:
    """Whether ``entry`` (at the top of a run directory) is one that fdattack writes, or a temporary file of one."""
    if entry.is_symlink():
        return False
    if entry.is_dir():
        return entry.name in OWN_FOLDERS
    name = entry.name
    if name.startswith(".") and name.endswith(".tmp"):  # atomic_write's ".config.yaml.k3j2x.tmp"
        name = name[1:].rsplit(".", 2)[0]
    return name in OWN_FILES


def refuse_matrix_root(folder: Path) -> None:
    """Raise CheckpointError where ``folder`` is a matrix's root (:mod:`~fdattack.tracking.folder_owner`): a run or a
    seeds aggregate there would write its files beside the matrix's, or over them."""
    owner = matrix_of(folder)
    if owner is not None:
        raise CheckpointError(f"output_dir {folder} is the root of the matrix {owner!r}; choose another output_dir")


class RunLock:
    """An exclusive, non-blocking ``flock`` on ``path`` (the file's content is left alone).

    Args:
        path: the lock file.
        create: create the file when missing (otherwise it must exist).

    Raises:
        CheckpointError: another process holds the lock; the message names the run directory.
    """

    def __init__(self, path: Path, create: bool) -> None:
        self.path = path
        self._fd: int | None = None
        self._fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)  # RDWR: NFS emulates flock with write locks
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            raise CheckpointError(
                f"output_dir {path.parent} is in use: another fdattack run holds its lock {path.name}; "
                "wait for it to end or choose another output_dir"
            ) from None

    def release(self) -> None:
        """Drop the lock (idempotent); the file stays, so that no process that opened it meanwhile locks a deleted file."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.release()


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


def config_fingerprint(cfg: DictConfig) -> str:
    """A digest of the config's result-deciding keys (:func:`~fdattack.tracking.results.result_tree`): what a checkpoint
    carries, so that a resume refuses a checkpoint written by another run (another seed, data, settings)."""
    return _digest(result_tree(cfg))


def _legacy_fingerprint(cfg: DictConfig) -> str:
    """The fingerprint of checkpoints written before ``name`` and the ``logger`` group stopped counting (it counted
    every ``logger`` key but ``logger.progress`` and ``logger.level``): such a checkpoint is still resumed with its own
    config."""
    tree = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    tree = {key: value for key, value in tree.items() if key not in ("resume", "output_dir")} if isinstance(tree, dict) else {}
    logger = tree.get("logger")
    if isinstance(logger, dict):
        tree["logger"] = {key: value for key, value in logger.items() if key not in ("progress", "level")}
    return _digest(tree)


def _digest(tree: dict) -> str:
    return hashlib.blake2b(json.dumps(tree, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()


def _round_of(row: Any) -> int | None:
    """The ``round`` of a ``rounds.jsonl`` row (None when the row is not an object with an integer round)."""
    value = row.get("round") if isinstance(row, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def recorded_rounds(rounds_path: Path) -> set[int]:
    """The rounds that ``rounds.jsonl`` records (lines that are not JSON objects with an integer ``round`` are ignored)."""
    found: set[int] = set()
    for line in rounds_path.read_text(encoding="utf-8", errors="replace").splitlines() if rounds_path.is_file() else []:
        try:
            round_index = _round_of(json.loads(line))
        except json.JSONDecodeError:
            continue
        if round_index is not None:
            found.add(round_index)
    return found


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
        self._lock: RunLock | None = None
        self._created = False  # claim() made the folder (a failed start removes it again)
        self._plan: str | None = None  # what claim() decided ("new" or "resume"), which prepare() then follows

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

    @property
    def lock_path(self) -> Path:
        """``.fdattack.lock``, locked by the run that uses the directory."""
        return self.path / LOCK_NAME

    def check(self, resume: bool) -> str:
        """Decide, reading only, what this run does with the directory.

        Returns:
            ``"resume"`` (a checkpoint to continue from), ``"new"`` (missing or empty), or ``"restart"``:
            a directory of an fdattack run that stopped before its first checkpoint (it holds the lock
            file and only fdattack's files, but no checkpoint and no ``metrics.json``), whose files
            :meth:`prepare` clears, with or without ``resume``.

        Raises:
            CheckpointError: not a folder; with ``resume``, no checkpoint (and not a restartable run);
                without, results (checkpoints, ``metrics.json``) or files that are not fdattack's.
        """
        if self.path.exists() and not self.path.is_dir():
            raise CheckpointError(f"output_dir {self.path} exists and is not a folder; choose another output_dir")
        refuse_matrix_root(self.path)
        has_checkpoint = self.checkpoints.latest() is not None
        if resume and has_checkpoint:
            return "resume"
        others = sorted(e for e in self.path.iterdir() if e.name != LOCK_NAME) if self.path.is_dir() else []
        if self.lock_path.is_file() and not has_checkpoint and not self.metrics_path.exists() and all(map(_is_own, others)):
            return "restart" if others else "new"
        if resume:
            raise CheckpointError(
                f"output_dir {self.path} has no checkpoint to resume from (no checkpoints/round_*.pt); "
                "run without resume=true in a new output_dir"
            )
        if has_checkpoint or self.metrics_path.exists():
            raise CheckpointError(f"output_dir {self.path} is not empty; pass resume=true to continue it or choose another output_dir")
        if others:
            foreign = [e.name for e in others if not _is_own(e)] if self.lock_path.is_file() else [e.name for e in others]
            raise CheckpointError(
                f"output_dir {self.path} holds files that are not from an fdattack run ({', '.join(foreign[:3])}); "
                "nothing there is deleted: choose another output_dir or empty it"
            )
        return "new"

    def claim(self, cfg: DictConfig) -> None:
        """Pre-flight: lock the directory for this run and check that the run may use it (:meth:`check`, and on
        resume :meth:`check_resume`), before anything is built. Writes nothing but the folder and the lock file, and
        clears a stranded run's files (:meth:`check`'s ``"restart"``) there and then, so that what the build writes into
        the folder (``artifacts/``) is this run's and stays.

        Raises:
            CheckpointError: another run holds the lock, or :meth:`check` or :meth:`check_resume` refuses.
        """
        if not self.is_writer:
            return
        try:
            if self.lock_path.is_file():  # lock before reading, so a running run is reported as such
                self._lock = RunLock(self.lock_path, create=False)
            if self.check(bool(cfg.resume)) == "resume":
                self.check_resume(cfg)
            if self._lock is None:
                self._created = not self.path.exists()
                self.path.mkdir(parents=True, exist_ok=True)
                self._lock = RunLock(self.lock_path, create=True)
            plan = self.check(bool(cfg.resume))  # again under the lock: another run may have started in between
            if plan == "restart":  # cleared now, before the run builds (which may write artifacts/ here)
                self._clear_stranded()
            self._plan = "resume" if plan == "resume" else "new"
        except OSError as err:
            self.release()
            raise CheckpointError(f"output_dir {self.path} cannot be used: {err.strerror or err}; choose another output_dir") from None
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Drop the lock (idempotent); a folder that :meth:`claim` created and nothing else wrote to is removed."""
        if self._lock is None:
            return
        self._lock.release()
        self._lock = None
        if self._created and self.path.is_dir() and [e.name for e in self.path.iterdir()] == [LOCK_NAME]:
            shutil.rmtree(self.path, ignore_errors=True)

    def prepare(self, resume: bool) -> None:
        """Create the layout: check the directory (:meth:`check`); a stranded run's files are cleared.

        Raises:
            CheckpointError: see :meth:`check`; nothing in the folder is touched then.
        """
        if not self.is_writer:
            return
        plan = self._plan or self.check(resume)  # a claimed directory as claim() found it: what the build wrote is the run's
        if plan == "restart":
            if self._lock is None:  # prepare() without claim(): never clear a directory that a running run holds
                self._lock = RunLock(self.lock_path, create=False)
            self._clear_stranded()
        self._resuming = plan == "resume"
        for sub in ("checkpoints", "images"):
            (self.path / sub).mkdir(parents=True, exist_ok=True)

    def _clear_stranded(self) -> None:
        """Remove a stranded run's files (all but the lock), saying so."""
        log.warning(
            "output_dir %s holds no checkpoint and no metrics.json (a run stopped before its first checkpoint); "
            "clearing its files and starting from scratch",
            self.path,
        )
        for entry in self.path.iterdir():
            if entry.name != LOCK_NAME:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    def forget_stop(self) -> None:
        """Remove ``exit.json`` once a resumed run has restored its checkpoint: the stop it recorded is being continued
        (a refused resume leaves it)."""
        if self.is_writer:
            (self.path / EXIT_NAME).unlink(missing_ok=True)

    def check_resume(self, cfg: DictConfig) -> None:
        """Check, reading only, that the directory is the run that ``cfg`` resumes (issue 30): its newest checkpoint is an
        fdattack checkpoint of this round, written under this config (its ``config_fingerprint``); the stored
        ``config.yaml`` matches (:meth:`check_config`), or, when missing, the checkpoint's fingerprint vouches for the
        config (it is written again); and ``rounds.jsonl`` holds every round up to the checkpoint's, from which
        ``metrics.json`` is rebuilt.

        Raises:
            CheckpointError: naming the file and what is wrong with it.
        """
        latest = self.checkpoints.latest()
        if latest is None:
            return
        round_index, path = latest
        payload = load_checkpoint(path, mmap=True)
        missing = [key for key in CHECKPOINT_KEYS if key not in payload]
        if missing:
            raise CheckpointError(f"{path}: not an fdattack run checkpoint (it has no {', '.join(missing)}); {self._instead(path)}")
        if payload["round"] != round_index:
            raise CheckpointError(
                f"{path}: holds round {payload['round']!r}, not round {round_index} as its name says; {self._instead(path)}"
            )
        self.check_config(cfg)  # first: it names the differing key
        fingerprint = payload.get("config_fingerprint")  # checkpoints before issue 30 carry none
        if fingerprint is not None and fingerprint not in (config_fingerprint(cfg), _legacy_fingerprint(cfg)):
            raise CheckpointError(
                f"{path}: this checkpoint was written by a run with another config (seed, data or settings) than "
                f"{self.config_path.name} and this command; resume with the config it was written with, or start afresh "
                "in another output_dir"
            )
        if fingerprint is None and not self.config_path.is_file():
            raise CheckpointError(
                f"{self.config_path}: missing, and {path.name} predates config fingerprints, so nothing shows this command "
                "is the stored run's config; restore config.yaml or choose another output_dir"
            )
        missing_rounds = sorted(set(range(round_index + 1)) - recorded_rounds(self.rounds_path))
        if missing_rounds:
            shown = ", ".join(map(str, missing_rounds[:5])) + (", ..." if len(missing_rounds) > 5 else "")
            raise CheckpointError(
                f"{self.rounds_path}: misses round(s) {shown} of the {round_index + 1} before {path.name}, whose metrics "
                "metrics.json is built from; restore rounds.jsonl or choose another output_dir"
            )

    def _instead(self, broken: Path) -> str:
        """What to do about the broken newest checkpoint ``broken``: fall back to the one before it, or start afresh
        (deleting the only checkpoint would leave nothing to resume from)."""
        earlier = [(index, path) for index, path in self.checkpoints.rounds() if path != broken]
        if earlier:
            return f"delete it to resume from {earlier[-1][1].name} (round {earlier[-1][0]}), or start afresh in another output_dir"
        return "it is the only checkpoint: start afresh in another output_dir"

    def check_config(self, cfg: DictConfig) -> None:
        """Check that ``cfg`` made the run being resumed (:func:`~fdattack.tracking.results.check_made_with`; reading
        only). A missing ``config.yaml`` passes here: :meth:`check_resume` lets the checkpoint's fingerprint vouch.

        Raises:
            CheckpointError: the stored config is unreadable, or differs in a result-deciding key (named, with its
                stored and given values).
        """
        if not self.config_path.is_file():
            return
        try:
            check_made_with(self.path, cfg)
        except CheckpointError as err:
            raise CheckpointError(f"cannot resume: {err}; resume with the same config or choose another output_dir") from None

    def write_config(self, cfg: DictConfig) -> None:
        """Write the resolved config to ``config.yaml``; on resume check it matches the stored one instead (a missing one,
        which :meth:`check_resume` let through on the checkpoint's fingerprint, is written again).

        Raises:
            CheckpointError: see :meth:`check_config`.
        """
        if not self.is_writer:
            return
        if self._resuming and self.config_path.is_file():
            self.check_config(cfg)
            return
        text = OmegaConf.to_yaml(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)))
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
        for line in self.rounds_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            round_index = _round_of(row)
            if round_index is not None and round_index <= last_round:
                kept.append(line + "\n")
        atomic_write(self.rounds_path, lambda handle: handle.write("".join(kept).encode()))

    def write_metrics(self, metrics: dict) -> None:
        """Atomically write ``metrics.json`` (sorted keys, indent 2; NaN/inf as null)."""
        if not self.is_writer:
            return
        text = json.dumps(to_jsonable(metrics), sort_keys=True, indent=2, allow_nan=False) + "\n"
        atomic_write(self.metrics_path, lambda handle: handle.write(text.encode()))

    def record_machine(self, machine: dict[str, Any], start_round: int) -> None:
        """Add this start's machine (:func:`~fdattack.tracking.machine.machine_info`) to ``machine.json``, with the round it
        starts after: a resumed run may finish on another machine than it began on."""
        if not self.is_writer:
            return
        path = self.path / MACHINE_NAME
        starts: list = []
        if start_round > 0 and path.is_file():
            try:
                starts = json.loads(path.read_text())
            except json.JSONDecodeError:
                starts = []
            starts = starts if isinstance(starts, list) else []
        starts.append({"start_round": start_round, **machine})
        text = json.dumps(to_jsonable(starts), indent=2, allow_nan=False) + "\n"
        atomic_write(path, lambda handle: handle.write(text.encode()))

    def image_path(self, name: str, round: int) -> Path:
        """``images/<name>_round_0003.png`` (the name should not contain ``/``)."""
        return self.path / "images" / f"{name}_round_{round:04d}.png"
