"""Honest attacks that fail part-way (a plugin module for ``plugins=[tests.faulty_attacks]``): what a run, its seeds and
the matrix report for an attack stopped after it had scored (issue 57)."""

from __future__ import annotations

from fdattack.attacks import ATTACKS
from fdattack.attacks.ldia import LDIAAttack
from fdattack.attacks.results import AttackResult


@ATTACKS.register("ldia_dies")
class LDIAThatDies(LDIAAttack):
    """LDIA that scores its first round and fails in its second: isolated, its worker is stopped then."""

    name = "ldia_dies"

    def on_round_end(self, round: int) -> list[AttackResult]:
        if round >= 2:
            raise RuntimeError("this attack fails from its second round on")
        return super().on_round_end(round)


@ATTACKS.register("ldia_unbuilt")
class LDIAThatCannotBeBuilt(LDIAAttack):
    """LDIA whose construction fails: in process, a plugin's attack is stopped before the first round."""

    name = "ldia_unbuilt"

    def __init__(self, *args: object) -> None:
        raise ValueError("this attack cannot be built")
