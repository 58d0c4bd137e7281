"""The attacker side: one module per attack, registered here by importing it (one line per attack).

Contract: an attack sees its own :class:`~fdattack.fd.threat.AttackerView` (the parts it declares in ``reads``), the
round records and what its threat model grants, and returns typed results (:mod:`.results`); it never imports the
evaluation side, the protocols or the run, and never scores itself.
"""

from fdattack.attacks import gmi, kedmi, lattack, ldia, lira, pli, public_mean, rmia, tbi, vmi  # noqa: F401  (registration)
from fdattack.attacks.base import ATTACKS, Attack, AttackContext

__all__ = ["ATTACKS", "Attack", "AttackContext"]
