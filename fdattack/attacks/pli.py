"""Paired-logits inversion (PLI, pli.md §7) as a passive observer of the round records.

Threat model: the honest-but-curious server. It sees every client's outputs on public samples
(through the record's :class:`~fdattack.fd.record.PublicQuery`), its own server model f_0, the public
set with labels and domain flags, and the list of target labels. It never sees private data: the
reconstructions are scored by a separate ``scorer`` built from ground truth (:mod:`fdattack.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from fdattack.attacks.pli_inputs import optimal_inputs
from fdattack.data.imageset import SENSITIVE, ImageSet
from fdattack.fd.record import RoundRecord
from fdattack.lit.inversion import InversionLitModule
from fdattack.metrics.image import pairwise_ssim, standard_ssim, total_variation
from fdattack.models.inversion import InversionDecoder
from fdattack.observers.base import Observer, ObserverOutput

#: ``(reconstructions, labels) -> (metrics, comparison grid)``, built from ground truth outside the attack
Scorer = Callable[[Tensor, Tensor], tuple[dict[str, float], Tensor]]


@dataclass(frozen=True)
class PLISettings:
    """Knobs of pli.md §7.8: tau (temperature), gamma (prior weight), alpha (entropy weight), beta (TV weight)."""

    tau: float = 3.0
    gamma: float = 0.03
    alpha: float = 5.0
    beta: float = 0.1
    lr: float = 3e-5
    weight_decay: float = 1e-4
    batch_size: int = 8
    epochs_per_round: int = 3
    max_width: int = 1024


def select_reconstructions(candidates: Tensor, beta: float) -> Tensor:
    """Eq. 11: per label, the client whose candidate has the lowest mean SSIM to the other clients'
    candidates plus beta * TV.

    Args:
        candidates: (K, T, C, H, W) every client's reconstruction of every target.

    Returns:
        (T,) index of the chosen client per target (0 when K = 1).
    """
    k, t = candidates.shape[:2]
    if k == 1:
        return torch.zeros(t, dtype=torch.long)
    choice = torch.empty(t, dtype=torch.long)
    for j in range(t):
        sims = pairwise_ssim(candidates[:, j], candidates[:, j], standard_ssim)
        mean_other = (sims.sum(dim=1) - sims.diagonal()) / (k - 1)
        choice[j] = torch.argmin(mean_other + beta * total_variation(candidates[:, j]))
    return choice


class PLIAttack(Observer):
    """One inversion network per client, trained at the protocol's attack point every round.

    Args:
        public: the public set (labels and domain flags are the attacker's knowledge).
        target_labels: L, the labels to reconstruct.
        num_classes: J.
        settings: the attack's knobs.
        scorer: ``(reconstructions, labels) -> (metrics, grid)``, built from ground truth outside the attack.
        seed: seed of the networks' initialisation and shuffling.
    """

    name = "pli"

    def __init__(self, public: ImageSet, target_labels: list[int], num_classes: int, settings: PLISettings, scorer: Scorer, seed: int) -> None:
        self.settings = settings
        self.scorer = scorer
        self.seed = seed
        self.num_classes = num_classes
        self.targets = torch.as_tensor(target_labels, dtype=torch.long)
        d0 = torch.nonzero(public.domain == SENSITIVE).flatten()
        self.d0_rows = d0
        self.d0_images = public.images[d0]
        self.d0_labels = public.labels[d0]
        # Eq. 8: the naive prior, the mean sensitive public image, for every label
        self.prior = self.d0_images.mean(dim=0, keepdim=True)
        self.states: dict[int, dict] = {}
        self.pending: RoundRecord | None = None
        self.last: Tensor | None = None

    def _module(self) -> InversionLitModule:
        c, s = self.d0_images.shape[1], self.d0_images.shape[-1]
        decoder = InversionDecoder(2 * self.num_classes, c, s, self.settings.max_width)
        return InversionLitModule(decoder, self.settings.lr, self.settings.weight_decay, self.settings.gamma)

    def on_record(self, record: RoundRecord) -> None:
        if record.attack_point and record.query is not None and record.query.has_server:
            self.pending = record

    def _train_client(self, k: int, record: RoundRecord, round: int) -> Tensor:
        """Eq. 3 on (p0, pk) pairs of D_0, then Eq. 10 on the optimal inputs; returns this client's candidates."""
        s = self.settings
        torch.manual_seed(self.seed + 7919 * k)
        module = self._module()
        optimizer = module.configure_optimizers()
        if k in self.states:
            module.load_state_dict(self.states[k]["model"])
            optimizer.load_state_dict(self.states[k]["optimizer"])
        assert record.query is not None
        p0 = torch.softmax(record.query("server", self.d0_rows) / s.tau, dim=-1)
        pk = torch.softmax(record.query(k, self.d0_rows) / s.tau, dim=-1)
        inputs = torch.cat([p0, pk], dim=-1)
        optimal = optimal_inputs(self.targets, self.num_classes, s.alpha)
        generator = torch.Generator().manual_seed(self.seed * 1000003 + round * 101 + k)
        module.train()
        for _ in range(s.epochs_per_round):
            for idx in torch.split(torch.randperm(len(inputs), generator=generator), s.batch_size):
                self._step(module, optimizer, {"input": inputs[idx], "x": self.d0_images[idx], "prior": self.prior.expand(len(idx), -1, -1, -1)})
            if s.gamma > 0:
                for chunk in torch.split(torch.arange(len(self.targets)), 64):
                    self._step(module, optimizer, {"input": optimal[chunk], "prior": self.prior.expand(len(chunk), -1, -1, -1)})
        self.states[k] = {"model": module.state_dict(), "optimizer": optimizer.state_dict()}
        return module.reconstruct(optimal)

    @staticmethod
    def _step(module: InversionLitModule, optimizer: torch.optim.Optimizer, batch: dict[str, Tensor]) -> None:
        loss = module.loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def on_round_end(self, round: int) -> ObserverOutput:
        record, self.pending = self.pending, None
        if record is None:
            return ObserverOutput()
        candidates = torch.stack([self._train_client(k, record, round) for k in record.query.clients])  # type: ignore[union-attr]
        choice = select_reconstructions(candidates, self.settings.beta)
        recon = candidates[choice, torch.arange(len(self.targets))]
        self.last = recon
        scores, grid = self.scorer(recon, self.targets)
        metrics = {f"attack/{self.name}/{k}": v for k, v in scores.items()}
        return ObserverOutput(metrics=metrics, images={f"attack/{self.name}/reconstructions": grid},
                              artifacts={f"{self.name}_reconstructions": {"images": recon, "labels": self.targets.clone()}})

    def state_dict(self) -> dict:
        return {"states": {str(k): v for k, v in self.states.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.states = {int(k): v for k, v in state.get("states", {}).items()}
