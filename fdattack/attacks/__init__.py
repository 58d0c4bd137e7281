"""Attack registry: importing this package registers every attack (one line per attack)."""

from fdattack.attacks import gmi, kedmi, lattack, ldia, lira, pli, public_mean, tbi, vmi  # noqa: F401  (registration)
from fdattack.attacks.base import ATTACKS, Attack, AttackContext

__all__ = ["ATTACKS", "Attack", "AttackContext"]
