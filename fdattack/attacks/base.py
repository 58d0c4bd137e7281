"""The attack contract: an observer of round records, built from an :class:`~fdattack.fd.threat.AttackerView`."""

from __future__ import annotations

from fdattack.attacks.results import AttackResult
from fdattack.fd.observer import Observer


class Attack(Observer):
    """An attack sees the records its threat model grants and returns typed results; it never scores itself.

    Subclasses collect what they need in :meth:`on_record` (a record's query answers only during its
    phase) and do their work in :meth:`on_round_end`.
    """

    name: str = "attack"

    def on_round_end(self, round: int) -> list[AttackResult]:
        """Called once per round after its last phase; the results go to the evaluation side."""
        return []
