"""Paired-logits inversion (PLI, Takahashi et al., CVPR 2023, §3) as a passive observer of the round records.

Threat model: the honest-but-curious server (§2 there). Its :class:`~fdattack.fd.threat.AttackerView`
holds the public set (labels only where the protocol gives them, domain flags), the target labels
and J; at the protocol's attack point it collects f_0's and every client's outputs on D_0 through the
record's phase-bound query, and trains later, at the round's end. It never sees private data and
never scores itself: it returns :class:`~fdattack.attacks.results.Reconstructions` (and once, its prior).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from fdattack.attacks.base import ATTACKS, AttackContext
from fdattack.attacks.inversion import InversionAttack, InversionSettings
from fdattack.attacks.pli_inputs import optimal_inputs
from fdattack.attacks.priors import PriorKind, PriorSettings, cached_prior
from fdattack.attacks.results import AttackResult, Reconstructions
from fdattack.engine import TensorRows
from fdattack.fd.record import RoundRecord
from fdattack.fd.threat import AttackerView, Capability
from fdattack.functional.image import pairwise_ssim, standard_ssim, total_variation
from fdattack.knobs import Choice, knob
from fdattack.randomness import derive_seed
from fdattack.tracking.progress import progress_iter

FINETUNE_BATCH = 64  #: Eq. 10 goes over the optimal inputs in order, in chunks of this size


class PLIVariant(Choice):
    full = "full"
    client_only = "client_only"


@dataclass
class PLISettings(InversionSettings):
    """PLI's knobs (App. C): gamma (prior weight), alpha (entropy weight), beta (TV weight), the ablations, the prior."""

    gamma: float = knob(0.03, "prior weight (Eqs. 3 and 10)", ge=0)
    alpha: float = knob(5.0, "entropy weight in Q (Eq. 4)", gt=0)
    beta: float = knob(0.1, "TV weight in the client selection (Eq. 11)", ge=0)
    variant: PLIVariant = knob(
        PLIVariant.full,
        "ablation (Takahashi et al., §4.5, Table 3): full | client_only (G sees client probabilities only, reconstructs from one-hot(j))",
    )
    finetune: bool = knob(True, "Eq. 10 fine-tuning on the optimal inputs after every Eq. 3 epoch (skipped anyway when gamma = 0)")
    prior: PriorSettings = knob(PriorSettings(), "the prior images x̄_j (Takahashi et al., §3.3)")


@dataclass(frozen=True)
class PLIInputs:
    """What PLI collects at the attack point: tempered outputs on the sensitive public rows it may query.

    Attributes:
        rows: (N0,) public rows (D_0, within what the query grants).
        server: (N0, J) softmax(f_0(x) / tau).
        clients: client -> (N0, J) softmax(l^k / tau), from what the client would upload.
    """

    rows: Tensor
    server: Tensor
    clients: dict[int, Tensor]


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


@ATTACKS.register("pli")
class PLIAttack(InversionAttack):
    """One inversion network per client, trained on the outputs collected at the protocol's attack point.

    Args:
        view: what the server knows; the protocol must offer a server model f_0 (checked from :meth:`required`).
        settings: the attack's knobs, its prior among them.
        context: seed, the store where the clients' networks wait between rounds, progress, engine.

    Raises:
        ConfigError: a learned prior where the public labels are unknown, a restorer without a known degradation.
    """

    name = "pli"
    Settings = PLISettings
    needs = InversionAttack.needs | {Capability.server_model}

    @classmethod
    def required(cls, settings: Any) -> frozenset[Capability]:
        learned = settings.prior.kind == PriorKind.learned
        return cls.needs | {Capability.public_labels} if learned else cls.needs

    def __init__(self, view: AttackerView, settings: PLISettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        self.settings: PLISettings = settings
        self.prior_settings = settings.prior.resolved(view)
        self.d0_rows = view.sensitive_rows()
        self.prior: Optional[Tensor] = None
        self.collected: Optional[PLIInputs] = None

    def _input_features(self) -> int:
        return self.num_classes if self.settings.variant == "client_only" else 2 * self.num_classes

    def _gamma(self) -> float:
        return self.settings.gamma

    def on_record(self, record: RoundRecord) -> None:
        """At the attack point, collect f_0's and every client's tempered outputs on D_0 (the query closes after this call)."""
        query = record.query
        if not record.attack_point or query is None:
            return
        rows = self.d0_rows[torch.isin(self.d0_rows, query.rows)]
        clients = {k: self._tempered(query, k, rows) for k in query.clients}
        self.collected = PLIInputs(rows, self._tempered(query, "server", rows), clients)

    def _prior_of(self, labels: Tensor) -> Tensor:
        """x̄_y for labels y; the naive prior's single image serves labels outside 0..J-1 (unknown labels, -1)."""
        assert self.prior is not None
        return self.prior[labels.clamp(0, self.num_classes - 1)]

    def _train_client(self, k: int, inputs: PLIInputs, round: int) -> Tensor:
        """Eq. 3 on (p0, pk) pairs of D_0, then Eq. 10 on the optimal inputs, each epoch; returns this client's candidates."""
        s = self.settings
        assert self.view.public is not None
        handle = self._restored(k)
        images, labels = self.view.public.images[inputs.rows], self.view.public.labels[inputs.rows]
        optimal = optimal_inputs(self.targets, self.num_classes, s.alpha)
        if s.variant == PLIVariant.client_only:
            pairs, optimal = inputs.clients[k], torch.nn.functional.one_hot(self.targets, self.num_classes).float()
        else:
            pairs = torch.cat([inputs.server, inputs.clients[k]], dim=-1)
        eq3 = TensorRows(input=pairs, x=images, prior=self._prior_of(labels))
        eq10 = TensorRows(input=optimal, prior=self._prior_of(self.targets))
        for epoch in range(s.epochs_per_round):
            self.engine.fit_module(handle, eq3, 1, derive_seed(self.seed, "pli", round, k, epoch), batch_size=s.batch_size)
            if s.gamma > 0 and s.finetune:
                self.engine.fit_module(handle, eq10, 1, 0, batch_size=FINETUNE_BATCH, shuffle=False)
        self._stored(round, k, handle)
        return handle.module.reconstruct(optimal).cpu()  # type: ignore[operator]

    def on_round_end(self, round: int) -> list[AttackResult]:
        inputs, self.collected = self.collected, None
        if inputs is None:
            return []
        results: list[AttackResult] = []
        if self.prior is None:  # built once, before the first attack, and reported as what PLI must beat (Table S-3)
            self.prior = cached_prior(self.view, self.prior_settings, self.seed, self.engine, self.context.cache, self.progress)
            results.append(Reconstructions(self.prior[self.targets], self.targets.clone(), role="prior"))
        clients = progress_iter(sorted(inputs.clients), f"{self.name} inversion, round {round}", self.progress)
        candidates = torch.stack([self._train_client(k, inputs, round) for k in clients])
        self.store.finish_round(round)
        choice = select_reconstructions(candidates, self.settings.beta)
        results.append(Reconstructions(candidates[choice, torch.arange(len(self.targets))], self.targets.clone()))
        return results

    def state_dict(self) -> dict:
        return {**super().state_dict(), "prior": self.prior}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.prior = state.get("prior")
