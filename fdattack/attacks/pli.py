"""Paired-logits inversion (PLI, pli.md §7) as a passive observer of the round records.

Threat model: the honest-but-curious server. It sees every client's outputs on public samples
(through the record's :class:`~fdattack.fd.record.PublicQuery`), its own server model f_0, the public
set with labels and domain flags, and the list of target labels. It never sees private data: the
reconstructions are scored by a separate ``scorer`` built from ground truth (:mod:`fdattack.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from fdattack.attacks.pli_inputs import optimal_inputs
from fdattack.attacks.priors import naive_prior
from fdattack.attacks.state_store import ClientStateStore
from fdattack.data.imageset import SENSITIVE, ImageSet
from fdattack.fd.record import RoundRecord
from fdattack.lit.inversion import InversionLitModule
from fdattack.metrics.image import pairwise_ssim, standard_ssim, total_variation
from fdattack.models.inversion import InversionDecoder
from fdattack.observers.base import Observer, ObserverOutput
from fdattack.tracking.progress import progress_iter

#: ``(reconstructions, labels) -> (metrics, comparison grid)``, built from ground truth outside the attack
Scorer = Callable[[Tensor, Tensor], tuple[dict[str, float], Tensor]]
#: ``() -> (J, C, H, W)`` prior images x̄_j, called once before the first attack (Eq. 8 or Eq. 9)
PriorBuilder = Callable[[], Tensor]


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
    variant: str = "full"  # full | client_only (Table 3 row 1: G sees p^k only, optimal input one-hot(j))
    finetune: bool = True  # Eq. 10 after each Eq. 3 epoch (skipped anyway when gamma = 0)


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
        prior: builds the (J, C, H, W) priors once, before the first attack; None = Eq. 8's naive prior.
        store: where the clients' networks wait between rounds (default: memory).
        progress: progress bar over the clients' inversion training (auto | always | never).
    """

    name = "pli"

    def __init__(self, public: ImageSet, target_labels: list[int], num_classes: int, settings: PLISettings, scorer: Scorer, seed: int,
                 prior: Optional[PriorBuilder] = None, store: Optional[ClientStateStore] = None, progress: str = "never") -> None:
        self.settings = settings
        self.scorer = scorer
        self.seed = seed
        self.num_classes = num_classes
        self.progress = progress
        self.store = store if store is not None else ClientStateStore()
        self.targets = torch.as_tensor(target_labels, dtype=torch.long)
        d0 = torch.nonzero(public.domain == SENSITIVE).flatten()
        self.d0_rows = d0
        self.d0_images = public.images[d0]
        self.d0_labels = public.labels[d0]
        self.prior_builder: PriorBuilder = prior if prior is not None else (lambda: naive_prior(public, num_classes))
        self.prior: Optional[Tensor] = None
        self.pending: RoundRecord | None = None
        self.last: Tensor | None = None

    def _module(self) -> InversionLitModule:
        c, s = self.d0_images.shape[1], self.d0_images.shape[-1]
        in_features = self.num_classes if self.settings.variant == "client_only" else 2 * self.num_classes
        decoder = InversionDecoder(in_features, c, s, self.settings.max_width)
        return InversionLitModule(decoder, self.settings.lr, self.settings.weight_decay, self.settings.gamma)

    def _restored(self, key: int) -> tuple[InversionLitModule, torch.optim.Optimizer]:
        """The network of ``key`` as the last finished round left it (freshly initialised before its first round)."""
        with torch.random.fork_rng(devices=[]):  # a passive attack leaves the run's random stream alone
            torch.manual_seed(self.seed + 7919 * key)
            module = self._module()
        optimizer = module.configure_optimizers()
        state = self.store.get(key)
        if state is not None:
            module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        return module, optimizer

    def on_record(self, record: RoundRecord) -> None:
        if record.attack_point and record.query is not None and record.query.has_server:
            self.pending = record

    def _prior_of(self, labels: Tensor) -> Tensor:
        """x̄_y for labels y; the naive prior's single image serves labels outside 0..J-1 (DS-FL's -1)."""
        assert self.prior is not None
        return self.prior[labels.clamp(0, self.num_classes - 1)]

    def _train_client(self, k: int, record: RoundRecord, round: int) -> Tensor:
        """Eq. 3 on (p0, pk) pairs of D_0, then Eq. 10 on the optimal inputs; returns this client's candidates."""
        s = self.settings
        module, optimizer = self._restored(k)
        assert record.query is not None
        pk = torch.softmax(record.query(k, self.d0_rows) / s.tau, dim=-1)
        optimal = optimal_inputs(self.targets, self.num_classes, s.alpha)
        if s.variant == "client_only":
            inputs, optimal = pk, torch.nn.functional.one_hot(self.targets, self.num_classes).float()
        else:
            inputs = torch.cat([torch.softmax(record.query("server", self.d0_rows) / s.tau, dim=-1), pk], dim=-1)
        generator = torch.Generator().manual_seed(self.seed * 1000003 + round * 101 + k)
        module.train()
        for _ in range(s.epochs_per_round):
            for idx in torch.split(torch.randperm(len(inputs), generator=generator), s.batch_size):
                self._step(module, optimizer, {"input": inputs[idx], "x": self.d0_images[idx], "prior": self._prior_of(self.d0_labels[idx])})
            if s.gamma > 0 and s.finetune:
                for chunk in torch.split(torch.arange(len(self.targets)), 64):
                    self._step(module, optimizer, {"input": optimal[chunk], "prior": self._prior_of(self.targets[chunk])})
        self.store.put(round, k, {"model": module.state_dict(), "optimizer": optimizer.state_dict()})
        return module.reconstruct(optimal)

    def _prior_report(self) -> ObserverOutput:
        """Build the priors on the first attack and score them like reconstructions (prior SSIM: Table S-3)."""
        self.prior = self.prior_builder()
        scores, grid = self.scorer(self.prior[self.targets], self.targets)
        metrics = {f"attack/{self.name}/prior_{k}": v for k, v in scores.items() if k in ("ssim", "accuracy", "eval_top1")}
        return ObserverOutput(metrics=metrics, images={f"attack/{self.name}/prior": grid})

    @staticmethod
    def _step(module: InversionLitModule, optimizer: torch.optim.Optimizer, batch: dict[str, Tensor]) -> None:
        loss = module.loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def on_round_end(self, round: int) -> ObserverOutput:
        record, self.pending = self.pending, None
        if record is None or record.query is None:
            return ObserverOutput()
        report = self._prior_report() if self.prior is None else ObserverOutput()
        clients = progress_iter(record.query.clients, f"{self.name} inversion, round {round}", self.progress)
        candidates = torch.stack([self._train_client(k, record, round) for k in clients])
        self.store.finish_round(round)
        choice = select_reconstructions(candidates, self.settings.beta)
        return self._output(candidates[choice, torch.arange(len(self.targets))], report)

    def _output(self, recon: Tensor, report: ObserverOutput) -> ObserverOutput:
        """Score the reconstructions; metrics, grid and the saved tensors, merged into ``report``."""
        self.last = recon
        scores, grid = self.scorer(recon, self.targets)
        report.metrics.update({f"attack/{self.name}/{k}": v for k, v in scores.items()})
        report.images[f"attack/{self.name}/reconstructions"] = grid
        report.artifacts[f"{self.name}_reconstructions"] = {"images": recon, "labels": self.targets.clone()}
        return report

    def state_dict(self) -> dict:
        return {"store": self.store.state_dict(), "prior": self.prior}

    def load_state_dict(self, state: dict) -> None:
        if "store" in state:
            self.store.load_state_dict(state["store"])
        self.prior = state.get("prior")
