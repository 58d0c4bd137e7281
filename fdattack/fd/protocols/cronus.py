"""Cronus (Chang et al. 2019): probability uploads, Diakonikolas robust mean (pdafd.md §4.3)."""

from __future__ import annotations

import torch

from fdattack.fd.aggregation import robust_mean
from fdattack.fd.objectives import cross_entropy, kl_to_probs, mixed_ce_kl
from fdattack.fd.protocols.base import PROTOCOLS, Phase, Protocol, RoundContext
from fdattack.fd.record import PayloadKind
from fdattack.fd.threat import ThreatModel


@PROTOCOLS.register("cronus")
class CronusProtocol(Protocol):
    """Per round: local CE, softmax uploads, per-sample robust mean, KL distillation.

    ``mixed_kd=true`` replaces the local and KD phases by one phase on private + public samples
    (CE on private rows, KL on public rows), as in the original Cronus.
    """

    name = "cronus"
    threat_model = ThreatModel(
        attacker="server, honest-but-curious",
        sees="every client's softmax probabilities on every public sample of the round",
        public_labels_known=False,  # the protocol never uses them
        query_rows="round",
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
        self.train_clients(ctx, "warmup", ctx.participants, lambda k: self.split.private[k], self.cfg.warmup_private_epochs, cross_entropy)

    def _local_train(self, ctx: RoundContext) -> None:
        self.train_clients(ctx, "local_train", ctx.participants, lambda k: self.split.private[k], self.cfg.private_epochs, cross_entropy)

    def _upload(self, ctx: RoundContext) -> None:
        self.upload_outputs(ctx)

    def _aggregate(self, ctx: RoundContext) -> None:
        mean, filtered = robust_mean(self.stacked_uploads(ctx), self.cfg.filter_eps, self.cfg.filter_tau)
        ctx.aggregate = mean
        ctx.aggregate_kind = "probs"
        ctx.metrics["protocol/cronus_filtered"] = float(filtered.sum())

    def _distill(self, ctx: RoundContext) -> None:
        public = self.public_subset(ctx)
        self.train_clients(ctx, "distill", ctx.senders, lambda k: public, self.cfg.kd_epochs, kl_to_probs, targets=ctx.aggregate)

    def _mixed(self, ctx: RoundContext) -> None:
        aggregate = ctx.aggregate
        assert aggregate is not None
        public = self.public_subset(ctx)
        private = self.split.private

        def targets(k: int) -> torch.Tensor:  # zero rows mark private samples (CE only)
            return torch.cat([torch.zeros(len(private[k]), aggregate.shape[1]), aggregate])

        self.train_clients(ctx, "distill", ctx.senders, lambda k: private[k].concat(public), self.cfg.kd_epochs, mixed_ce_kl, targets=targets)
