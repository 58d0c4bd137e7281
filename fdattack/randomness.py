"""Seeds, derived and set: the ground floor every side stands on.

Every random stream of a run is derived from the run seed and names (:func:`derive_seed`), so a run reproduces and
resumes exactly, and no stream reveals another: the attacker's seed is derived too and never the run seed, from which
the run's secrets derive (issue 28).

The global generators (Python's ``random``, NumPy's ``np.random``, torch's CPU and CUDA generators) never hold the run
seed either (issue 47): a run seeds them from a derived seed (:func:`seed_everything_quietly`), the protocol draws from
its own :class:`GlobalStreams`, swapped in for its phases only, and each call into an attack starts from streams of its
own (:func:`observer_streams`). So what an attack reads from a global generator (``np.random.get_state()``,
``random.getstate()``, ``torch.get_rng_state()``) is neither the run seed nor anything the protocol drew, and what an
attack draws or seeds there moves none of the protocol's draws.
"""

from __future__ import annotations

import hashlib
import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch


def derive_seed(*keys: object) -> int:
    """A 63-bit seed derived from ``keys`` (run seed, round, phase, client ...), stable across runs."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def seed_globals(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (CPU, and every CUDA device) with ``seed`` (up to 64 bits;
    NumPy's takes it as two 32-bit words)."""
    random.seed(seed)
    np.random.seed([seed & 0xFFFFFFFF, seed >> 32])
    torch.manual_seed(seed)


def seed_everything_quietly(seed: int) -> None:
    """Seed the global generators for a run of run seed ``seed``: from ``derive_seed(seed, "globals")``, never ``seed``
    itself, from which the run's secrets derive (Lightning's ``seed_everything`` would seed them with it and write it
    to ``PL_GLOBAL_SEED``). ``torch.initial_seed()`` answers the derived seed."""
    seed_globals(derive_seed(seed, "globals"))


@dataclass(frozen=True)
class _Saved:
    python: tuple
    numpy: tuple
    torch: torch.Tensor
    cuda: list[torch.Tensor] | None  # None: CUDA was not initialised


def _save() -> _Saved:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return _Saved(random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)


def _load(saved: _Saved) -> None:
    random.setstate(saved.python)
    np.random.set_state(saved.numpy)
    torch.set_rng_state(saved.torch)
    if saved.cuda is not None:
        torch.cuda.set_rng_state_all(saved.cuda)
    elif torch.cuda.is_initialized():  # initialised since: no CUDA draw came from this state; give it a stream of its own
        torch.cuda.manual_seed_all(int.from_bytes(hashlib.blake2b(saved.torch.numpy().tobytes(), digest_size=8).digest(), "little"))


class GlobalStreams:
    """One owner's state of the global generators (Python's, NumPy's, torch's CPU and CUDA ones), started from ``seed``.

    ``with streams.active():`` swaps the owner's state in for the block, keeps where the block left it for the owner's
    next block, and gives back the state the generators had before it: nothing drawn or seeded inside a block reaches
    code outside it, and nothing outside reaches the block.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._state: _Saved | None = None  # None: not used yet (as freshly seeded)

    @contextmanager
    def active(self) -> Iterator[None]:
        outside = _save()
        if self._state is None:
            seed_globals(self.seed)
        else:
            _load(self._state)
        try:
            yield
        finally:
            self._state = _save()
            _load(outside)


def observer_streams(root: int, observer: str, round: int, call: str) -> GlobalStreams:
    """Fresh global streams for one call into an observer (an attack): ``observer`` seeing the record of phase ``call`` of
    ``round``, or ending the round. Seeded from (the attacks' root, observer, round, call) through :func:`derive_seed`
    (one-way), so what the attack reads from them tells it nothing of what anyone else drew; the root is the run seed
    in process and a secret of the run's isolated (``attack_seed``), which no search of seeds finds."""
    return GlobalStreams(derive_seed(root, "observer", observer, round, call))


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's global stream (the device's too) for the block and restore the run's stream after it."""
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
