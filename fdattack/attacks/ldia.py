"""Label distribution inference (LDIA, Shi et al., PoPETs 2025, §3.2): the server averages each client's softmax outputs on the
round's public samples (Eq. 4), then averages the per-round estimates over the rounds.

The honest-but-curious server reads only what crosses the wire: every client's upload on the round's public
rows S_t (= D_inf; make it class-balanced with ``protocol.public_stratified=true``, as §3.2 asks). Images the
server added to the batch are left out. Probability uploads (Cronus) are averaged as they are (the paper does not say).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from fdattack.attacks.base import ATTACKS, Attack, AttackContext
from fdattack.attacks.common import is_communication
from fdattack.attacks.results import AttackResult, LabelDistributions
from fdattack.fd.record import RoundRecord
from fdattack.fd.threat import AttackerView, Capability
from fdattack.functional.label_distribution import estimate_from_outputs
from fdattack.knobs import knob


@dataclass
class LDIASettings:
    rounds: Optional[int] = knob(
        None, "average the per-round estimates of the first `rounds` communication rounds (the paper: 10); null = every round so far", ge=1
    )


def round_estimates(record: RoundRecord) -> dict[int, Tensor]:
    """Eq. 4 for every client that uploaded in ``record``: p̂^(t) over the round's public rows (added images left out)."""
    assert record.batch is not None
    n = len(record.batch.rows)
    return {k: estimate_from_outputs(u.outputs[:n], u.kind) for k, u in record.uploads.items() if u.outputs is not None}  # type: ignore[arg-type]


@ATTACKS.register("ldia")
class LDIAAttack(Attack):
    """p̂ = (1/R) Σ_t p̂^(t) per client, reported every round (the running mean)."""

    name = "ldia"
    Settings = LDIASettings
    needs = frozenset({Capability.output_uploads})
    produces = frozenset({LabelDistributions})

    def __init__(self, view: AttackerView, settings: LDIASettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        self.sums: dict[int, Tensor] = {}
        self.counts: dict[int, int] = {}

    def on_record(self, record: RoundRecord) -> None:
        limit = self.settings.rounds
        if not is_communication(record) or (limit is not None and record.round > limit):
            return
        for k, estimate in round_estimates(record).items():
            self.sums[k] = self.sums.get(k, torch.zeros_like(estimate)) + estimate
            self.counts[k] = self.counts.get(k, 0) + 1

    def on_round_end(self, round: int) -> list[AttackResult]:
        if not self.sums:
            return []
        clients = tuple(sorted(self.sums))
        return [LabelDistributions(clients, torch.stack([self.sums[k] / self.counts[k] for k in clients]))]

    def state_dict(self) -> dict:
        return {"sums": {str(k): v for k, v in self.sums.items()}, "counts": {str(k): v for k, v in self.counts.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.sums = {int(k): v for k, v in state.get("sums", {}).items()}
        self.counts = {int(k): int(v) for k, v in state.get("counts", {}).items()}
