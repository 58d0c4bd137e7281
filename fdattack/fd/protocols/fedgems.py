"""FedGEMS (Cheng et al. 2021) with selective knowledge fusion, as PLI runs it (Takahashi et al., CVPR 2023, App. B, C, and their code)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.data.imageset import IndexedBatch
from fdattack.fd.aggregation import fedgems_ensemble, fedgems_fusion_loss, fedgems_kl
from fdattack.fd.protocols.base import PROTOCOLS, Phase, Protocol, RoundContext
from fdattack.fd.protocols.settings import ProtocolSettings
from fdattack.fd.threat import Capability, ThreatModel
from fdattack.knobs import Choice, knob
from fdattack.lit.classifier import Objective, cross_entropy, vmappable


class KLMode(Choice):
    code = "code"
    standard = "standard"


def fedgems_client(epsilon: float, kl_mode: str) -> Objective:
    """FedGEMS client public phase: eps*CE(z, y) + (1 - eps)*KL(server logits, z) (the PLI authors' code).

    ``kl_mode="code"`` reproduces the authors' ``nn.KLDivLoss()(log_softmax(teacher), softmax(z))``
    (element-wise mean, teacher in the log slot); ``"standard"`` is batchmean KL(teacher || student).
    """

    @vmappable
    def objective(logits: Tensor, batch: IndexedBatch) -> Tensor:
        kl = fedgems_kl(logits, batch["target"], kl_mode)  # type: ignore[typeddict-item]
        return epsilon * cross_entropy(logits, batch) + (1.0 - epsilon) * kl

    return objective


@dataclass
class FedGEMSSettings(ProtocolSettings):
    name: str = "fedgems"
    private_epochs: int = knob(2, "per round: client epochs of CE on the private set", ge=0)
    public_epochs: int = knob(2, "per round: client epochs of eps*CE + (1-eps)*KL to the server logits on the public set", ge=0)
    server_epochs: int = knob(1, "per round: server epochs of selective knowledge fusion", ge=0)
    epsilon: float = knob(0.75, "weight of CE against KL", ge=0, le=1)
    kl_mode: KLMode = knob(
        KLMode.code, "code (nn.KLDivLoss mean, teacher in the log slot, as the authors' code) | standard (batchmean KL(teacher||student))"
    )


@PROTOCOLS.register("fedgems")
class FedGEMSProtocol(Protocol):
    """Per round: client CE on private data, server selective fusion on the labeled public set, client
    distillation (eps*CE + (1-eps)*KL) to the server's logits.

    Clients upload their logits on the round's public samples; the server uses them only for the
    samples it gets wrong and has no pool entry for (case S3). The global knowledge pool persists
    across rounds and is saved with checkpoints.
    """

    name = "fedgems"
    Settings = FedGEMSSettings
    has_server_model = True
    threat_model = ThreatModel(
        attacker="server, honest-but-curious (may request logits on any public sample)",
        sees="client logits on requested public samples; its own server model",
        public_labels_known=True,
        query_rows="public",  # the server requests logits; PLI requests all of D_0 (the PLI authors' code)
        # no added samples: the fusion needs a label and a knowledge-pool row for every public sample
        adversary=frozenset({Capability.choose_public_batch, Capability.send_aggregate, Capability.query_chosen_batch}),
    )

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        n, j = len(self.split.public), self.split.num_classes
        self.pool = torch.zeros(n, j)
        self.has_pool = torch.zeros(n, dtype=torch.bool)

    def round_phases(self, round: int) -> list[Phase]:
        return [
            Phase("local_train", self._local_train),
            Phase("upload", self._upload),
            Phase("server_train", self._server_train),
            Phase("distill", self._distill, attack_point=True),
        ]

    def _local_train(self, ctx: RoundContext) -> None:
        self.train_on_private(ctx, "local_train", self.cfg.private_epochs)

    def _upload(self, ctx: RoundContext) -> None:
        self.upload_outputs(ctx)

    def _fusion_objective(self, ctx: RoundContext, ensemble: Tensor) -> Objective:
        """Server loss of the PLI authors' FedGEMS code; S1 rows update the pool with the server's detached logits."""
        assert ctx.batch is not None
        rows_of = ctx.batch.rows

        def objective(logits: Tensor, batch: IndexedBatch) -> Tensor:
            rows = rows_of[batch["index"].cpu()]
            pool, has_pool = self.pool[rows].to(logits.device), self.has_pool[rows].to(logits.device)
            loss, correct = fedgems_fusion_loss(
                logits, batch["y"], pool, has_pool, ensemble[batch["index"].cpu()].to(logits.device), self.cfg.epsilon, self.cfg.kl_mode
            )
            correct = correct.cpu()
            self.pool[rows[correct]] = logits.detach().float().cpu()[correct]
            self.has_pool[rows[correct]] = True
            return loss

        return objective

    def _server_train(self, ctx: RoundContext) -> None:
        public = self.public_subset(ctx)
        ensemble = self.aggregate_uploads(ctx, lambda outputs, rows: fedgems_ensemble(outputs, public.labels[rows]), "logits")
        self.train_server(ctx, "server_train", public, self.cfg.server_epochs, self._fusion_objective(ctx, ensemble))
        self.record_server_outputs(ctx)
        ctx.aggregate = ctx.server_outputs
        ctx.aggregate_kind = "logits"
        ctx.metrics["protocol/fedgems_pool_fraction"] = float(self.has_pool.float().mean())

    def _distill(self, ctx: RoundContext) -> None:
        public = self.public_subset(ctx)
        objective = fedgems_client(self.cfg.epsilon, self.cfg.kl_mode)
        self.train_clients(
            ctx, "distill", ctx.participants, lambda k: public, self.cfg.public_epochs, objective, targets=self.aggregate_for(ctx)
        )

    def extra_state(self) -> dict:
        return {"pool": self.pool.clone(), "has_pool": self.has_pool.clone()}

    def load_extra_state(self, state: dict) -> None:
        self.pool = state["pool"].clone()
        self.has_pool = state["has_pool"].clone()
