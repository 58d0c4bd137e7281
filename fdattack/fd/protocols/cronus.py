"""Cronus (Chang et al. 2019): probability uploads, Diakonikolas robust mean (Shi et al., PoPETs 2025, §2.1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fdattack.fd.aggregation import robust_mean
from fdattack.fd.protocols.base import PROTOCOLS, Phase, Protocol, RoundContext
from fdattack.fd.protocols.settings import ProtocolSettings
from fdattack.fd.threat import ThreatModel
from fdattack.knobs import knob
from fdattack.lit.objectives import kl_to_probs, mixed_ce_kl
from fdattack.vocabulary import SERVER_POWERS, PayloadKind


@dataclass
class CronusSettings(ProtocolSettings):
    name: str = "cronus"
    warmup_private_epochs: int = knob(0, "epochs of CE on the private set before round 1", ge=0)
    private_epochs: int = knob(5, "per round: local-update epochs of CE on the private set", ge=0)
    kd_epochs: int = knob(10, "per round: epochs of KL to the robust-mean probabilities on the public subset", ge=0)
    mixed_kd: bool = knob(False, "one kd_epochs phase on private + public mixed, instead of separate phases")
    filter_eps: float = knob(0.1, "Diakonikolas filter: assumed corrupted fraction", gt=0, lt=0.5)
    filter_tau: float = knob(0.1, "Diakonikolas filter: confidence", gt=0, lt=1)


@PROTOCOLS.register("cronus")
class CronusProtocol(Protocol):
    """Per round: local CE, softmax uploads, per-sample robust mean, KL distillation.

    ``mixed_kd=true`` replaces the local and KD phases by one phase on private + public samples
    (CE on private rows, KL on public rows), as in the original Cronus.
    """

    name = "cronus"
    Settings = CronusSettings
    threat_model = ThreatModel(
        attacker="server, honest-but-curious",
        sees="every client's softmax probabilities on every public sample of the round",
        public_labels_known=False,  # the protocol never uses them
        query_rows="round",
        adversary=SERVER_POWERS,
    )

    def upload_kind(self) -> tuple[PayloadKind, float]:
        return "probs", 1.0

    def setup_phases(self) -> list[Phase]:
        return [Phase("warmup", self._warmup)] if self.cfg.warmup_private_epochs > 0 else []

    def round_phases(self, round: int) -> list[Phase]:
        head = [] if self.cfg.mixed_kd else [Phase("local_train", self._local_train)]
        tail = [Phase("distill", self._mixed if self.cfg.mixed_kd else self._distill)] if self.num_clients > 1 or self.cfg.mixed_kd else []
        return head + [Phase("upload", self._upload), Phase("aggregate", self._aggregate, attack_point=True)] + tail

    def _warmup(self, ctx: RoundContext) -> None:
        self.train_on_private(ctx, "warmup", self.cfg.warmup_private_epochs)

    def _local_train(self, ctx: RoundContext) -> None:
        self.train_on_private(ctx, "local_train", self.cfg.private_epochs)

    def _upload(self, ctx: RoundContext) -> None:
        self.upload_outputs(ctx)

    def _aggregate(self, ctx: RoundContext) -> None:
        filtered: list[float] = []

        def rule(outputs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            mean, dropped = robust_mean(outputs, self.cfg.filter_eps, self.cfg.filter_tau)
            filtered.append(float(dropped.sum()))
            return mean

        ctx.aggregate = self.aggregate_uploads(ctx, rule, "probs")
        ctx.aggregate_kind = "probs"
        ctx.metrics["protocol/cronus_filtered"] = sum(filtered)

    def _distill(self, ctx: RoundContext) -> None:
        public = self.public_subset(ctx)
        self.train_clients(ctx, "distill", ctx.senders, lambda k: public, self.cfg.kd_epochs, kl_to_probs, targets=self.aggregate_for(ctx))

    def _mixed(self, ctx: RoundContext) -> None:
        received = self.aggregate_for(ctx)
        public = self.public_subset(ctx)
        private = self.split.private

        def targets(k: int) -> torch.Tensor:  # zero rows mark private samples (CE only)
            aggregate = received(k)
            return torch.cat([torch.zeros(len(private[k]), aggregate.shape[1]), aggregate])

        self.train_clients(
            ctx, "distill", ctx.senders, lambda k: private[k].concat(public), self.cfg.kd_epochs, mixed_ce_kl, targets=targets
        )
