"""DS-FL (Itahara et al. 2021) with entropy-reduction aggregation (Takahashi et al., CVPR 2023, App. B; Shi et al., PoPETs 2025, §2.1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fdattack.fd.aggregation import era
from fdattack.fd.protocols.base import PROTOCOLS, Phase, Protocol, RoundContext
from fdattack.fd.protocols.settings import ProtocolSettings
from fdattack.fd.threat import Capability, ThreatModel
from fdattack.knobs import Choice, knob
from fdattack.lit.objectives import soft_cross_entropy
from fdattack.vocabulary import SERVER_POWERS, PayloadKind


class DSFLUpload(Choice):
    probs = "probs"
    logits = "logits"


@dataclass
class DSFLSettings(ProtocolSettings):
    name: str = "dsfl"
    warmup_private_epochs: int = knob(0, "epochs of CE on the private set before round 1", ge=0)
    private_epochs: int = knob(2, "per round: client epochs of CE on the private set", ge=0)
    distill_epochs: int = knob(2, "per round: client epochs of soft CE to the ERA labels (skipped when K = 1)", ge=0)
    server_epochs: int = knob(1, "per round: global-model epochs of soft CE to the ERA labels", ge=0)
    train_global_model: bool = knob(True, "train DS-FL's global model (the server model f_0)")
    era_temperature: float = knob(0.1, "ERA sharpening temperature", gt=0)
    upload: DSFLUpload = knob(DSFLUpload.probs, "what clients send: probs (softmax, PLI's DS-FL) | logits (server applies softmax, PDA-FD)")


@PROTOCOLS.register("dsfl")
class DSFLProtocol(Protocol):
    """Per round: local CE, upload on unlabeled public data, ERA, global-model distillation, client distillation.

    Clients upload softmax probabilities (``upload=probs``, PLI) or logits that the server turns into
    probabilities (``upload=logits``, PDA-FD); ERA is softmax(mean(probs) / T_ERA) either way.
    """

    name = "dsfl"
    Settings = DSFLSettings
    has_server_model = True
    enable_hints = {Capability.server_model: "protocol.train_global_model=true"}
    threat_model = ThreatModel(
        attacker="server, honest-but-curious",
        sees="every client's outputs (softmax or logits) on every public sample of the round",
        public_labels_known=False,  # the public set is unlabeled
        query_rows="round",
        adversary=SERVER_POWERS,
    )

    @classmethod
    def server_model_enabled(cls, cfg: DSFLSettings) -> bool:
        return bool(cfg.train_global_model)

    def upload_kind(self) -> tuple[PayloadKind, float]:
        return ("probs", 1.0) if self.cfg.upload == "probs" else ("logits", 1.0)

    def setup_phases(self) -> list[Phase]:
        return [Phase("warmup", self._warmup)] if self.cfg.warmup_private_epochs > 0 else []

    def round_phases(self, round: int) -> list[Phase]:
        phases = [
            Phase("local_train", self._local_train),
            Phase("upload", self._upload),
            Phase("aggregate", self._aggregate, attack_point=self.server is None),
        ]
        if self.server is not None:
            phases.append(Phase("server_train", self._server_train, attack_point=True))
        if self.num_clients > 1:
            phases.append(Phase("distill", self._distill))
        return phases

    def _warmup(self, ctx: RoundContext) -> None:
        self.train_on_private(ctx, "warmup", self.cfg.warmup_private_epochs)

    def _local_train(self, ctx: RoundContext) -> None:
        self.train_on_private(ctx, "local_train", self.cfg.private_epochs)

    def _upload(self, ctx: RoundContext) -> None:
        self.upload_outputs(ctx)

    def _aggregate(self, ctx: RoundContext) -> None:
        def rule(outputs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            return era(outputs if self.cfg.upload == "probs" else torch.softmax(outputs, dim=-1), self.cfg.era_temperature)

        ctx.aggregate = self.aggregate_uploads(ctx, rule, "probs")
        ctx.aggregate_kind = "probs"

    def _server_train(self, ctx: RoundContext) -> None:
        self.train_server(ctx, "server_train", self.public_subset(ctx), self.cfg.server_epochs, soft_cross_entropy, targets=ctx.aggregate)
        self.record_server_outputs(ctx)

    def _distill(self, ctx: RoundContext) -> None:
        public = self.public_subset(ctx)
        self.train_clients(
            ctx, "distill", ctx.senders, lambda k: public, self.cfg.distill_epochs, soft_cross_entropy, targets=self.aggregate_for(ctx)
        )
