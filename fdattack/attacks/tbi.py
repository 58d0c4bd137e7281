"""Training-based inversion (TBI, Yang et al. CCS'19) as PLI's baseline (Takahashi et al., CVPR 2023, §4.2, App. C).

One inversion network on every client's tempered outputs on all the public rows the query grants
(D_0 and D_a), pooled; reconstruction from one-hot(j). ``last_client_only`` reproduces the authors'
closure bug (every "client" is the last one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from fdattack.attacks.base import ATTACKS, AttackContext
from fdattack.attacks.inversion import InversionAttack, InversionSettings
from fdattack.attacks.results import AttackResult, Reconstructions
from fdattack.engine import TensorRows
from fdattack.fd.record import RoundRecord
from fdattack.fd.threat import AttackerView
from fdattack.knobs import knob
from fdattack.randomness import derive_seed
from fdattack.tracking.progress import progress_iter


@dataclass
class TBISettings(InversionSettings):
    """TBI's knobs: the inversion network's, and the authors' closure bug."""

    last_client_only: bool = knob(False, "reproduce the authors' closure bug (all outputs from the last client)")


@dataclass(frozen=True)
class TBIInputs:
    """Collected at the attack point: the public rows and each source's (N, J) tempered outputs on them."""

    rows: Tensor
    outputs: list[Tensor]


@ATTACKS.register("tbi")
class TBIAttack(InversionAttack):
    """Pooled TBI: no server logits, no prior, no selection. ``last_client_only`` is the authors' closure bug."""

    name = "tbi"
    Settings = TBISettings

    def __init__(self, view: AttackerView, settings: TBISettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        self.last_client_only = settings.last_client_only
        self.collected: Optional[TBIInputs] = None

    def on_record(self, record: RoundRecord) -> None:
        """At the attack point, collect every client's tempered outputs on every granted public row."""
        query = record.query
        if not record.attack_point or query is None:
            return
        clients = list(query.clients)
        sources = [clients[-1]] * len(clients) if self.last_client_only else clients
        self.collected = TBIInputs(query.rows, [self._tempered(query, k, query.rows) for k in sources])

    def on_round_end(self, round: int) -> list[AttackResult]:
        inputs, self.collected = self.collected, None
        if inputs is None:
            return []
        assert self.view.public is not None
        s = self.settings
        pairs = torch.cat(inputs.outputs)
        images = self.view.public.images[inputs.rows].repeat(len(inputs.outputs), 1, 1, 1)
        handle = self._restored(0)
        rows = TensorRows(input=pairs, x=images)
        for epoch in progress_iter(range(s.epochs_per_round), f"tbi inversion, round {round}", self.progress):
            self.engine.fit_module(handle, rows, 1, derive_seed(self.seed, "tbi", round, epoch), batch_size=s.batch_size)
        self._stored(round, 0, handle)
        self.store.finish_round(round)
        recon: Tensor = handle.module.reconstruct(torch.nn.functional.one_hot(self.targets, self.num_classes).float()).cpu()  # type: ignore[operator]
        return [Reconstructions(recon, self.targets.clone())]
