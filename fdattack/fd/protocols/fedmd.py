"""FedMD (Li & Wang 2019) as PLI runs it (Takahashi et al., CVPR 2023, App. B, C; Shi et al., PoPETs 2025, §2.1)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from fdattack.data.imageset import UNLABELED
from fdattack.errors import ConfigError
from fdattack.fd.aggregation import mean_logits
from fdattack.fd.protocols.base import PROTOCOLS, Phase, Protocol, RoundContext
from fdattack.fd.protocols.settings import ProtocolSettings
from fdattack.fd.threat import Capability, ServerAggregation, ThreatModel
from fdattack.knobs import knob
from fdattack.lit.classifier import Objective
from fdattack.lit.objectives import cross_entropy, l1_to_logits
from fdattack.vocabulary import SERVER_POWERS

log = logging.getLogger(__name__)


def consensus(uploads: Tensor, labels: Tensor) -> Tensor:
    """FedMD's server rule: the mean of the uploaded logits (:func:`~fdattack.fd.aggregation.mean_logits`; labels unused)."""
    return mean_logits(uploads)


@dataclass
class FedMDSettings(ProtocolSettings):
    name: str = "fedmd"
    transfer_public_epochs: int = knob(5, "transfer phase: epochs of CE on the labeled public set, before round 1", ge=0)
    transfer_private_epochs: int = knob(5, "transfer phase: epochs of CE on the private set, before round 1", ge=0)
    digest_epochs: int = knob(1, "per round: epochs of L1 to the consensus on the public set (skipped when K = 1)", ge=0)
    revisit_epochs: int = knob(1, "per round: epochs of CE on the private set", ge=0)
    private_with_public: bool = knob(
        False,
        "transfer_private and revisit train on the private set together with the labeled public set, so a client keeps "
        "the public classes (the L-Attack's clients, Xiao et al., DSN 2024, Fig. 1, §VI-A); FedMD's own revisit is private only",
    )
    server_model: bool = knob(True, "train the attacker-added server model f_0 on the labeled public set (PLI Eq. 1)")
    server_epochs: int = knob(1, "per round: epochs of the server model on the public set", ge=0)


@PROTOCOLS.register("fedmd")
class FedMDProtocol(Protocol):
    """Transfer learning, then per round: communicate raw logits, consensus mean, digest (L1), revisit (CE).

    With ``server_model=true`` the attacker adds a server model f_0 trained on the labeled public set
    (PLI Eq. 1); it takes no part in the protocol.
    """

    name = "fedmd"
    Settings = FedMDSettings
    enable_hints = {Capability.server_model: "protocol.server_model=true"}
    #: the digest's loss to the received aggregate (LabelAvg: soft cross-entropy)
    digest_objective: ClassVar[Objective] = staticmethod(l1_to_logits)
    threat_model = ThreatModel(
        attacker="server, honest-but-curious",
        sees="raw logits of every client on every public sample of the round",
        public_labels_known=True,
        query_rows="public",  # PLI's attack point is an extra upload on any public row (the PLI authors' code)
        adversary=SERVER_POWERS,
    )

    @classmethod
    def server_model_enabled(cls, cfg: FedMDSettings) -> bool:
        return bool(cfg.server_model)

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        unlabeled = int((self.split.public.labels == UNLABELED).sum())
        if self.cfg.private_with_public and unlabeled:
            raise ConfigError(f"protocol.private_with_public=true needs a labeled public set; the data's has {unlabeled} unlabeled rows")

    def setup_phases(self) -> list[Phase]:
        return [Phase("transfer_public", self._transfer_public), Phase("transfer_private", self._transfer_private)]

    def round_phases(self, round: int) -> list[Phase]:
        phases = [Phase("upload", self._upload), Phase("aggregate", self._aggregate)]
        if self.num_clients > 1:  # with K = 1 the digest step is skipped (as the PLI authors' code)
            phases.append(Phase("digest", self._digest))
        phases.append(Phase("revisit", self._revisit, attack_point=self.server is None))
        if self.server is not None:
            phases.append(Phase("server_train", self._server_train, attack_point=True))
        return phases

    def _transfer_public(self, ctx: RoundContext) -> None:
        """CE on the labeled public set; skipped where it has no labels (a foreign public set; PDA-FD does not say how FedMD handles it)."""
        public = self.split.public
        if self.cfg.transfer_public_epochs and not bool((public.labels != UNLABELED).any()):
            log.info("fedmd: the public set has no labels, so the %d transfer_public epochs are skipped", self.cfg.transfer_public_epochs)
            return
        self.train_clients(ctx, "transfer_public", ctx.participants, lambda k: public, self.cfg.transfer_public_epochs, cross_entropy)

    def _transfer_private(self, ctx: RoundContext) -> None:
        self._train_private(ctx, "transfer_private", self.cfg.transfer_private_epochs)

    def _train_private(self, ctx: RoundContext, phase: str, epochs: int) -> None:
        """CE on each participant's private set, joined by the labeled public set with ``private_with_public``."""
        if not self.cfg.private_with_public:
            self.train_on_private(ctx, phase, epochs)
            return
        public = self.split.public
        self.train_clients(ctx, phase, ctx.participants, lambda k: self.split.private[k].concat(public), epochs, cross_entropy)

    def _upload(self, ctx: RoundContext) -> None:
        self.upload_outputs(ctx)

    def aggregation(self) -> ServerAggregation:
        """The consensus mean of logits (LabelAvg: vote smoothing of label uploads)."""
        return ServerAggregation(consensus, self.upload_kind()[0])

    def _aggregate(self, ctx: RoundContext) -> None:
        """The server's rule (:meth:`aggregation`) on the round's uploads, with the public labels of their rows."""
        assert ctx.batch is not None
        server, labels = self.aggregation(), ctx.batch.labels_in(self.split.public.labels)
        ctx.aggregate = self.aggregate_uploads(ctx, lambda outputs, rows: server.rule(outputs, labels[rows]), server.kind)
        ctx.aggregate_kind = server.kind

    def _digest(self, ctx: RoundContext) -> None:
        public = self.public_subset(ctx)
        self.train_clients(
            ctx, "digest", ctx.senders, lambda k: public, self.cfg.digest_epochs, self.digest_objective, targets=self.aggregate_for(ctx)
        )

    def _revisit(self, ctx: RoundContext) -> None:
        self._train_private(ctx, "revisit", self.cfg.revisit_epochs)

    def _server_train(self, ctx: RoundContext) -> None:
        self.train_server(ctx, "server_train", self.public_subset(ctx), self.cfg.server_epochs, cross_entropy)
        self.record_server_outputs(ctx)
