"""Atomic, weights-only-safe checkpoints and the RNG state they carry.

A checkpoint is written to a temporary file in the target folder, flushed, fsynced and then moved
over the target with :func:`os.replace`, so a crash (even SIGKILL) during the write leaves the
previous checkpoint intact and never a half-written file under the final name. Payloads contain only
types that :func:`torch.load` accepts with ``weights_only=True``; numpy arrays and scalars are
converted on save, anything else is refused before the write starts.
"""

from __future__ import annotations

import collections
import os
import random
import re
import tempfile
from pathlib import Path
from typing import IO, Any, Callable

import numpy as np
import torch

from fdattack.errors import CheckpointError

_LEAF_TYPES = (bool, int, float, complex, str, bytes, type(None), torch.Tensor, torch.dtype, torch.device, torch.Size)
_ROUND_FILE = re.compile(r"^round_(\d+)\.pt$")
_TMP_PREFIX = "."
_TMP_SUFFIX = ".tmp"


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable; silently skipped where directories cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` through a temporary sibling file so readers see the old or the new content.

    Args:
        path: final file name; its folder must exist.
        write: called with the open binary temporary file.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX + path.name + ".", suffix=_TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def _weights_only_safe(obj: Any, where: str) -> Any:
    """Return ``obj`` with numpy values turned into tensors / Python scalars; refuse other types.

    Containers are rebuilt only where something changed, so a module ``state_dict`` keeps its
    ``_metadata``.
    """
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, _LEAF_TYPES):
        return obj
    if type(obj) in (dict, collections.OrderedDict):
        items = {k: _weights_only_safe(v, f"{where}.{k}") for k, v in obj.items()}
        if all(items[k] is obj[k] for k in obj):
            return obj
        rebuilt = type(obj)(items)
        if hasattr(obj, "_metadata"):
            rebuilt._metadata = obj._metadata  # type: ignore[attr-defined]
        return rebuilt
    if type(obj) in (list, tuple):
        values = [_weights_only_safe(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return obj if all(a is b for a, b in zip(values, obj)) else type(obj)(values)
    raise TypeError(
        f"checkpoint payload {where}: {type(obj).__name__} cannot be loaded with weights_only=True; "
        "store tensors, numbers, strings, bools, None and dicts/lists of them"
    )


def save_checkpoint(path: Path, payload: dict) -> None:
    """Atomically save ``payload`` to ``path`` (see the module docstring).

    Args:
        path: the checkpoint file; its folder must exist.
        payload: tensors, numbers, strings, bools, None and nested dicts/lists/tuples of them;
            numpy arrays and scalars are converted to tensors and Python numbers.

    Raises:
        TypeError: a value that ``torch.load(weights_only=True)`` could not read back, named by its key path.
    """
    safe = _weights_only_safe(payload, "payload")
    atomic_write(Path(path), lambda handle: torch.save(safe, handle))


def load_checkpoint(path: Path, mmap: bool = False) -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` onto the CPU, weights only.

    Args:
        mmap: map the tensors' storage from the file instead of reading it (a cheap look at the payload's keys).

    Raises:
        CheckpointError: the file is missing, unreadable, truncated, corrupt or not a dict payload.
    """
    path = Path(path)
    what_to_do = "delete it to resume from an earlier checkpoint, or start a new output_dir"
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint not found") from None
    except Exception as err:  # zipfile, pickle, EOF and torch errors alike
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({reason}); {what_to_do}") from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path}: not an fdattack checkpoint (holds a {type(payload).__name__}, not a dict); {what_to_do}")
    return payload


def rng_state() -> dict:
    """Python ``random``, numpy's global and torch's CPU (and CUDA) RNG states, weights-only safe."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore RNG states captured by :func:`rng_state` (CUDA states only where CUDA is available)."""
    py = state["python"]
    random.setstate((int(py["version"]), tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        count = torch.cuda.device_count()
        torch.cuda.set_rng_state_all(list(cuda)[:count])


class CheckpointDir:
    """A folder of round checkpoints ``round_0003.pt`` keeping only the newest ``keep``.

    Args:
        folder: where the checkpoints live (created on the first save).
        keep: how many round checkpoints to keep, >= 1.
        writable: False makes :meth:`save` a no-op (non-zero DDP ranks); reading still works.
    """

    def __init__(self, folder: Path, keep: int, writable: bool = True) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.folder = Path(folder)
        self.keep = keep
        self.writable = writable

    def path_for(self, round: int) -> Path:
        """The file of round ``round``."""
        return self.folder / f"round_{round:04d}.pt"

    def rounds(self) -> list[tuple[int, Path]]:
        """Every complete checkpoint as ``(round, path)``, oldest first; temporary files are ignored."""
        if not self.folder.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := _ROUND_FILE.match(p.name))]
        return sorted(found)

    def latest(self) -> tuple[int, Path] | None:
        """The checkpoint with the highest round, or None when there is none."""
        found = self.rounds()
        return found[-1] if found else None

    def save(self, round: int, payload: dict) -> Path:
        """Atomically write round ``round``, then delete the oldest checkpoints beyond ``keep``.

        Temporary files left behind by a writer that was killed are removed too.
        """
        path = self.path_for(round)
        if not self.writable:
            return path
        self.folder.mkdir(parents=True, exist_ok=True)
        save_checkpoint(path, payload)
        for _, old in self.rounds()[: -self.keep]:
            old.unlink(missing_ok=True)
        for stale in self.folder.glob(f"{_TMP_PREFIX}round_*{_TMP_SUFFIX}"):
            stale.unlink(missing_ok=True)
        return path
