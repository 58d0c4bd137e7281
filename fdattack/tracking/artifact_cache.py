"""A content-addressed store of trained artifacts that do not depend on the cell of a run.

Some networks a run trains depend only on the data setting, their own settings and a seed: PLI's learned prior, the
GAN priors of the inversions, the evaluation classifiers. Across the cells of a leakage matrix (every protocol and
defense at one data setting and seed) they are the same, so each is trained once and read back by every later run that
asks for it. An entry is named by a digest of everything that determines it (:func:`digest`: settings, seeds, shapes
and the training tensors' bytes), so a changed input trains anew and two inputs never share an entry.

Entries are written atomically (:func:`~fdattack.tracking.checkpoint.save_checkpoint`); a run that finds one it cannot
read says so in one line and trains it again. An exclusive lock per entry makes a second process that asks for an
entry being trained wait for it instead of training it twice.
"""

from __future__ import annotations

import dataclasses
import enum
import fcntl
import hashlib
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from fdattack.errors import CheckpointError
from fdattack.tracking.checkpoint import load_checkpoint, save_checkpoint

log = logging.getLogger("fdattack")

DIGEST_BYTES = 16


def digest(*parts: Any) -> str:
    """A hex name for ``parts``: tensors by dtype, shape and bytes; dataclasses field by field; containers item by item;
    anything else by its ``repr`` (numbers, strings, None, enums)."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in parts:
        _feed(h, part)
    return h.hexdigest()


def _feed(h: "hashlib._Hash", part: Any) -> None:
    if isinstance(part, torch.Tensor):
        tensor = part.detach().cpu().contiguous()
        h.update(f"tensor:{tensor.dtype}:{tuple(tensor.shape)}:".encode())
        h.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif dataclasses.is_dataclass(part) and not isinstance(part, type):
        h.update(f"{type(part).__qualname__}(".encode())
        for field in dataclasses.fields(part):
            h.update(f"{field.name}=".encode())
            _feed(h, getattr(part, field.name))
        h.update(b")")
    elif isinstance(part, dict):
        h.update(b"{")
        for key in sorted(part, key=repr):
            _feed(h, key)
            _feed(h, part[key])
        h.update(b"}")
    elif isinstance(part, (list, tuple)):
        h.update(f"{type(part).__name__}[".encode())
        for item in part:
            _feed(h, item)
        h.update(b"]")
    elif isinstance(part, enum.Enum):
        h.update(f"{type(part).__qualname__}.{part.name};".encode())
    else:
        h.update(f"{type(part).__name__}:{part!r};".encode())


class ArtifactCache:
    """Trained artifacts under ``root/<kind>_<digest>.pt``, each a checkpoint payload (a dict of tensors and plain
    values).

    Args:
        root: the cache's folder (created on the first write).
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path(self, kind: str, key: str) -> Path:
        """The entry's file."""
        return self.root / f"{kind}_{key}.pt"

    def fetch(
        self, kind: str, key: str, make: Callable[[], dict], check: Callable[[dict], None] | None = None, writer: bool = True
    ) -> dict:
        """The entry ``kind``/``key``, read back, or made by ``make`` and stored.

        Args:
            check: raises on a payload that cannot be what was asked for; it is then made again, as an unreadable one is.
            writer: whether this process stores what it makes, holding the entry's lock meanwhile (False for every DDP
                rank but the first: they make it together, the first writes it).
        """
        path = self.path(kind, key)
        if not writer:
            return self._read(path, check) or make()
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path.parent / f".{path.stem}.lock"):
            stored = self._read(path, check)
            if stored is not None:
                return stored
            payload = make()
            save_checkpoint(path, payload)
            return payload

    @staticmethod
    def _read(path: Path, check: Callable[[dict], None] | None) -> dict | None:
        if not path.is_file():
            return None
        try:
            payload = load_checkpoint(path)
            if check is not None:
                check(payload)
            return payload
        except (CheckpointError, KeyError, ValueError, TypeError, RuntimeError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
            log.warning("cache entry %s is unusable (%s); training it again", path, reason)
            return None


@contextmanager
def _locked(lock: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock`` for the block (released when the process ends, however it ends)."""
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
