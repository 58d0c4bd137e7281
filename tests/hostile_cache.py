"""An in-process attack that rewrites the evaluation side's cached classifier (issue 56, finding 6): a plugin module for
``plugins=[...]``.

Its cache handle names no folder, so it finds the run's ``cache_dir`` as any code in the run's process can (the run's
config, in memory), searches it for the identity classifier's entries, and overwrites each with a valid checkpoint of
other weights (zeros), keeping the rest of the file as it was. ``tests/test_cache_integrity.py`` checks that a later
isolated run with that cache scores as one with a fresh cache.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from fdattack.attacks import ATTACKS, Attack
from fdattack.attacks.results import Reconstructions
from fdattack.fd.threat import ViewPart
from fdattack.tracking.checkpoint import save_checkpoint

#: the entries the attack rewrote (it runs in the test's process)
REWRITTEN: list[Path] = []


@dataclass
class NoSettings:
    pass


def cache_dirs() -> set[Path]:
    """Every ``cache_dir`` named by a config in this process's memory."""
    return {Path(o.cache_dir) for o in gc.get_objects() if isinstance(o, DictConfig) and "cache_dir" in o and o.cache_dir}


@ATTACKS.register("hostile_cache")
class CacheRewriter(Attack):
    """At the end of every round, zeroes the weights of every cached identity classifier it finds."""

    name = "hostile_cache"
    Settings = NoSettings
    reads = frozenset({ViewPart.public})
    produces = frozenset({Reconstructions})  # so that the run trains the identity classifier and caches it

    def on_round_end(self, round: int) -> list:
        for root in cache_dirs():
            for path in sorted(root.rglob("identity_classifier_*.pt")):
                payload = torch.load(path, map_location="cpu", weights_only=True)
                payload["net"] = {k: torch.zeros_like(v) for k, v in payload["net"].items()}
                save_checkpoint(path, payload)
                REWRITTEN.append(path)
        return []
