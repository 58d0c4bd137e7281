"""Seeds, derived and set: the ground floor every side stands on.

Every random stream of a run is derived from the run seed and names (:func:`derive_seed`), so a run reproduces and
resumes exactly, and no stream reveals another: the attacker's seed is derived too and never the run seed, from which
the run's secrets derive (issue 28).
"""

from __future__ import annotations

import hashlib
import random
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch


def derive_seed(*keys: object) -> int:
    """A 63-bit seed derived from ``keys`` (run seed, round, phase, client ...), stable across runs."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def seed_everything_quietly(seed: int) -> None:
    """Seed python, numpy and torch with ``seed`` (Lightning's ``seed_everything`` without its log line), so that nothing
    in the process reports the run seed back, from which the run's secrets derive: no environment variable holds it
    (Lightning's writes ``PL_GLOBAL_SEED``), and ``torch.initial_seed()`` answers a seed derived from it while the CPU
    generator draws exactly the run seed's stream (:func:`report_initial_seed`). GPUs draw from a derived seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(derive_seed(seed, "cuda"))
    report_initial_seed(derive_seed(seed, "reported"))


def report_initial_seed(reported: int) -> None:
    """Make ``torch.initial_seed()`` answer ``reported`` without changing the CPU generator's stream: the seed is the
    first 8 bytes (little-endian) of the generator's state, which the stream does not read."""
    state = torch.get_rng_state()
    state[:8] = torch.tensor(list(reported.to_bytes(8, "little")), dtype=torch.uint8)
    torch.set_rng_state(state)


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's global stream (the device's too) for the block and restore the run's stream after it."""
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
