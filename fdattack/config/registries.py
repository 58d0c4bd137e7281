"""The component registries a config is composed from: protocols, attacks and defenses, each registering its own
settings dataclass (importing them registers every component; the installed plugins' entry points are loaded on first
use, :mod:`fdattack.plugins`)."""

from __future__ import annotations

from fdattack.attacks import ATTACKS
from fdattack.defenses import DEFENSES
from fdattack.fd.protocols import PROTOCOLS
from fdattack.plugins import load_plugins
from fdattack.registry import Registry


def registries() -> tuple[Registry, Registry, Registry]:
    """(PROTOCOLS, ATTACKS, DEFENSES), with every installed plugin's components registered."""
    load_plugins()
    return PROTOCOLS, ATTACKS, DEFENSES
