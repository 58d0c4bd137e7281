"""Training-based inversion (TBI, Yang et al. CCS'19) as PLI's baseline (pli.md §8.1, §13.20).

One inversion network on every client's tempered outputs on all public data (D_0 and D_a), pooled;
reconstruction from one-hot(j). ``last_client_only`` reproduces the authors' closure bug (every
"client" is the last one).
"""

from __future__ import annotations

import torch
from torch import Tensor

from typing import Optional

from fdattack.attacks.pli import PLIAttack, PLISettings, Scorer
from fdattack.attacks.state_store import ClientStateStore
from fdattack.data.imageset import ImageSet
from fdattack.fd.record import RoundRecord
from fdattack.lit.inversion import InversionLitModule
from fdattack.models.inversion import InversionDecoder
from fdattack.observers.base import ObserverOutput
from fdattack.tracking.progress import progress_iter


class TBIAttack(PLIAttack):
    """Pooled TBI: no server logits, no prior, no selection."""

    name = "tbi"

    def __init__(self, public: ImageSet, target_labels: list[int], num_classes: int, settings: PLISettings, scorer: Scorer,
                 seed: int, last_client_only: bool = False, store: Optional[ClientStateStore] = None, progress: str = "never") -> None:
        super().__init__(public, target_labels, num_classes, settings, scorer, seed, store=store, progress=progress)
        self.public = public
        self.last_client_only = last_client_only

    def on_record(self, record: RoundRecord) -> None:
        if record.attack_point and record.query is not None:
            self.pending = record

    def _module(self) -> InversionLitModule:
        c, s = self.public.images.shape[1], self.public.images.shape[-1]
        return InversionLitModule(InversionDecoder(self.num_classes, c, s, self.settings.max_width), self.settings.lr, self.settings.weight_decay, 0.0)

    def on_round_end(self, round: int) -> ObserverOutput:
        record, self.pending = self.pending, None
        if record is None or record.query is None:
            return ObserverOutput()
        s = self.settings
        rows = torch.arange(len(self.public))
        clients = record.query.clients
        sources = [clients[-1]] * len(clients) if self.last_client_only else list(clients)
        inputs = torch.cat([torch.softmax(record.query(k, rows) / s.tau, dim=-1) for k in sources])
        images = self.public.images.repeat(len(sources), 1, 1, 1)
        module, optimizer = self._restored(0)
        generator = torch.Generator().manual_seed(self.seed * 1000003 + round)
        module.train()
        for _ in progress_iter(range(s.epochs_per_round), f"tbi inversion, round {round}", self.progress):
            for idx in torch.split(torch.randperm(len(inputs), generator=generator), s.batch_size):
                self._step(module, optimizer, {"input": inputs[idx], "x": images[idx]})
        self.store.put(round, 0, {"model": module.state_dict(), "optimizer": optimizer.state_dict()})
        self.store.finish_round(round)
        recon: Tensor = module.reconstruct(torch.nn.functional.one_hot(self.targets, self.num_classes).float())
        return self._output(recon, ObserverOutput())
