"""The component registries a config is composed from: protocols, attacks and defenses, each registering its own
settings dataclass (importing them registers every component)."""

from __future__ import annotations

from fdattack.attacks import ATTACKS
from fdattack.defenses import DEFENSES
from fdattack.fd.protocols import PROTOCOLS
from fdattack.registry import Registry


def registries() -> tuple[Registry, Registry, Registry]:
    """(PROTOCOLS, ATTACKS, DEFENSES)."""
    return PROTOCOLS, ATTACKS, DEFENSES
