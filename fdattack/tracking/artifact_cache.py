"""A content-addressed store of trained artifacts that do not depend on the cell of a run.

Some networks a run trains depend only on the data setting, their own settings and a seed: PLI's learned prior, the
GAN priors of the inversions, the evaluation classifiers. Across the cells of a leakage matrix (every protocol and
defense at one data setting and seed) they are the same, so each is trained once and read back by every later run that
asks for it. An entry is named by a digest of everything that determines it (:func:`digest`: settings, seeds, shapes
and the training tensors' bytes), so a changed input trains anew and two inputs never share an entry.

Each entry records who wrote it, as ``<side>/<mode>``: the side is ``evaluation`` or ``attack/<name>``, the mode the
``isolation.mode`` of the writer, ``process`` (an isolated run's evaluation side, or an attack in a confined worker) or
``in_process`` (a run whose attacks share its process, and so could have written any file). The mode is part of the
file's name, ``root/<kind>_<key>.<mode>.pt``, so the two never overwrite each other. Beside the payload an entry holds
(under :data:`ENTRY_KEY`) its writer and a digest of its kind, key, writer and content; a payload that does not match its
digest is not used. A cache reads the entries of the modes it trusts (:attr:`ArtifactCache.readable`): an isolated
run's only ``process`` ones, so nothing an in-process run's attack wrote reaches its scores; an in-process run's either.
A digest checks content, not authorship: code running in an in-process run can write any file, a ``process`` entry with
a matching digest too, so a cache shared with in-process runs of plugins written to cheat is only as safe as they are
(docs/threat-model.md).

Entries are written atomically (:func:`~fdattack.tracking.checkpoint.save_checkpoint`); a run that finds one it cannot
read, or whose digest or writer does not match, says so in one line and trains it again. An exclusive lock per entry
makes a second process that asks for an entry being trained wait for it instead of training it twice: one line names the
holder, and past :data:`LOCK_WAIT_S` the waiter trains the entry itself and keeps it nowhere. A cache that cannot be
written (read-only) is read; what it lacks is trained and not kept, as an entry that cannot be stored is (a folder in
its place, a full disk), each with one warning. An attack gets an
:class:`AttackCache`, which fetches from its own folder without holding it.
"""

from __future__ import annotations

import dataclasses
import enum
import fcntl
import hashlib
import json
import logging
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Callable

import torch

from fdattack.errors import CheckpointError
from fdattack.tracking.checkpoint import load_checkpoint, save_checkpoint

log = logging.getLogger("fdattack")

DIGEST_BYTES = 16
#: the writers' modes (``isolation.mode``), the most trusted first
MODES = ("process", "in_process")
#: the key of an entry's payload under which it keeps its writer and content digest
ENTRY_KEY = "cache_entry"
#: the longest a process waits for another's making of an entry before it makes the entry itself, unkept
LOCK_WAIT_S = 3600.0
#: how often a waiting process tries the lock again
LOCK_POLL_S = 0.5
#: the attacks' caches, by token (:class:`AttackCache`)
_ATTACK_CACHES: dict[int, ArtifactCache] = {}


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
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")  # 0-dim too
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
    """Trained artifacts under ``root/<kind>_<digest>.<mode>.pt``, each a checkpoint payload (a dict of tensors and plain
    values) sealed with its writer and content digest (the module docstring).

    Args:
        root: the cache's folder (created on the first write).
        mode: the ``isolation.mode`` of the side that writes here: ``process`` or ``in_process``.
        side: ``evaluation``, or ``attack/<name>`` for an attack's folder.
    """

    def __init__(self, root: Path | str, mode: str, side: str = "evaluation") -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: one of {', '.join(MODES)}")
        self.root, self.mode, self.side = Path(root), mode, side

    @property
    def readable(self) -> tuple[str, ...]:
        """The writers' modes whose entries this cache reads, in turn: an isolated run's own only, an in-process run's either."""
        return ("process",) if self.mode == "process" else MODES

    def path(self, kind: str, key: str, mode: str | None = None) -> Path:
        """The entry's file as written in ``mode`` (None: this cache's)."""
        return self.root / f"{kind}_{key}.{mode or self.mode}.pt"

    def fetch(
        self, kind: str, key: str, make: Callable[[], dict], check: Callable[[dict], None] | None = None, writer: bool = True
    ) -> dict:
        """The entry ``kind``/``key``, read back, or made by ``make`` and stored under this cache's mode.

        Args:
            check: raises on a payload that cannot be what was asked for; it is then made again, as an unreadable one is.
            writer: whether this process stores what it makes, holding the entry's lock meanwhile (False for every DDP
                rank but the first: they make it together, the first writes it).
        """
        if not writer:
            return self._stored(kind, key, check) or make()
        path = self.path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = EntryLock(path.parent / f".{path.stem}.lock")
        except OSError as err:  # a read-only cache is still read
            stored = self._stored(kind, key, check)
            if stored is None:
                log.warning("cache %s cannot be written (%s): the %s is trained here and not kept", self.root, _why(err), kind)
            return stored if stored is not None else make()
        with lock:
            if not lock.wait(f"the {kind} {key}"):  # another process held it past LOCK_WAIT_S: train it here, unkept
                return self._stored(kind, key, check) or make()
            stored = self._stored(kind, key, check)
            if stored is not None:
                return stored
            payload = make()
            try:
                save_checkpoint(path, {**payload, ENTRY_KEY: self._seal(kind, key, self.mode, payload)})
            except OSError as err:  # a folder in its place, a full disk: the run goes on with what it trained
                log.warning("cache entry %s cannot be kept (%s); the %s trained here is used", path, _why(err), kind)
            return payload

    def _seal(self, kind: str, key: str, mode: str, payload: dict) -> dict:
        """What an entry written in ``mode`` holds under :data:`ENTRY_KEY`: its writer and the digest of its content."""
        written_by = f"{self.side}/{mode}"
        return {"written_by": written_by, "digest": digest(kind, key, written_by, payload)}

    def _stored(self, kind: str, key: str, check: Callable[[dict], None] | None) -> dict | None:
        """The first usable entry of the modes this cache reads, or None."""
        for mode in self.readable:
            payload = self._read(kind, key, mode, check)
            if payload is not None:
                return payload
        return None

    def _read(self, kind: str, key: str, mode: str, check: Callable[[dict], None] | None) -> dict | None:
        path = self.path(kind, key, mode)
        if not path.is_file():
            return None
        try:
            payload = load_checkpoint(path)
            if payload.pop(ENTRY_KEY, None) != self._seal(kind, key, mode, payload):
                raise ValueError(f"its content does not match its digest, or it was not written by {self.side}/{mode}")
            if check is not None:
                check(payload)
            return payload
        except (CheckpointError, OSError, KeyError, ValueError, TypeError, RuntimeError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
            log.warning("cache entry %s is unusable (%s); not read", path, reason)
            return None


class AttackCache:
    """An attack's cache (``context.cache``): :meth:`ArtifactCache.fetch` on the attack's own folder, which it does not
    hold: the folder waits in this module's table behind a random token, as a
    :class:`~fdattack.attacks.state_store.ClientStateStore`'s does.

    Args:
        root: the attack's folder (``<cache_dir>/attacks/<attack>``).
        attack: the attack's name (its entries' writer).
        mode: where the attack runs: ``process`` (a confined worker) or ``in_process``.
    """

    __slots__ = ("_token",)

    def __init__(self, root: Path | str, attack: str, mode: str) -> None:
        self._token = secrets.randbits(64)
        _ATTACK_CACHES[self._token] = ArtifactCache(root, mode, side=f"attack/{attack}")

    def __del__(self) -> None:
        """Drop the folder from the table (not with a ``weakref.finalize``, whose callback the handle would lead to)."""
        if _ATTACK_CACHES is not None:  # None late in the interpreter's shutdown
            _ATTACK_CACHES.pop(self._token, None)

    def fetch(
        self, kind: str, key: str, make: Callable[[], dict], check: Callable[[dict], None] | None = None, writer: bool = True
    ) -> dict:
        """:meth:`ArtifactCache.fetch` in the attack's folder."""
        return _ATTACK_CACHES[self._token].fetch(kind, key, make, check, writer)


def _why(err: OSError) -> str:
    return f"{err.strerror or type(err).__name__}{f': {err.filename}' if err.filename else ''}"


class EntryLock:
    """An exclusive ``flock`` on an entry's lock file (released when the process ends, however it ends), taken with a
    bounded wait (:meth:`wait`); its holder writes who it is into the file, for a waiter to name.

    Raises:
        OSError: the lock file cannot be opened for writing (a read-only cache: the caller reads without it).
    """

    def __init__(self, path: Path) -> None:
        self.path, self._held = path, False
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)

    def __enter__(self) -> EntryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._held:
            os.ftruncate(self._fd, 0)  # no stale holder for the next waiter to name
        os.close(self._fd)  # drops the lock too

    def wait(self, what: str) -> bool:
        """Take the lock to make ``what``: at once, or after one line naming its holder, polling until
        :data:`LOCK_WAIT_S` have passed; False (with a warning) if they did."""
        deadline = time.monotonic() + LOCK_WAIT_S
        told = False
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self._holder()
                    log.warning("gave up waiting for %s after %.0f s (%s): %s is made here, unkept", self.path, LOCK_WAIT_S, holder, what)
                    return False
                if not told:
                    log.info("waiting for %s (%s) to finish %s, at most %.0f s", self.path, self._holder(), what, LOCK_WAIT_S)
                    told = True
                time.sleep(LOCK_POLL_S)
        holder = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")})
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, holder.encode(), 0)
        self._held = True
        return True

    def _holder(self) -> str:
        try:
            held = json.loads(os.pread(self._fd, 4096, 0) or b"{}")
            return f"held by process {int(held['pid'])} on {held['host']} since {held['since']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "held by another process"
