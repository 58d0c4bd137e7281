"""FedGEMS (Cheng et al. 2021) with selective knowledge fusion, as PLI runs it (pli.md §5.2, §13.8)."""

from __future__ import annotations

import torch
from torch import Tensor

from fdattack.data.imageset import IndexedBatch
from fdattack.fd.aggregation import fedgems_ensemble, fedgems_fusion_loss
from fdattack.fd.objectives import cross_entropy, fedgems_client
from fdattack.fd.protocols.base import PROTOCOLS, Phase, Protocol, RoundContext
from fdattack.fd.threat import ThreatModel
from fdattack.lit.classifier import Objective


@PROTOCOLS.register("fedgems")
class FedGEMSProtocol(Protocol):
    """Per round: client CE on private data, server selective fusion on the labeled public set, client
    distillation (eps*CE + (1-eps)*KL) to the server's logits.

    Clients upload their logits on the round's public samples; the server uses them only for the
    samples it gets wrong and has no pool entry for (case S3). The global knowledge pool persists
    across rounds and is saved with checkpoints.
    """

    name = "fedgems"
    has_server_model = True
    threat_model = ThreatModel(
        attacker="server, honest-but-curious (may request logits on any public sample)",
        sees="client logits on requested public samples; its own server model",
        public_labels_known=True,
        query_rows="public",  # the server requests logits; PLI requests all of D_0 (pli.md §13.9)
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
        self.train_clients(ctx, "local_train", ctx.participants, lambda k: self.split.private[k], self.cfg.private_epochs, cross_entropy)

    def _upload(self, ctx: RoundContext) -> None:
        self.upload_outputs(ctx)

    def _fusion_objective(self, ctx: RoundContext, ensemble: Tensor) -> Objective:
        """Server loss of §5.2(b); S1 rows update the pool with the server's detached logits."""
        rows_of = ctx.public_indices
        assert rows_of is not None

        def objective(logits: Tensor, batch: IndexedBatch) -> Tensor:
            rows = rows_of[batch["index"].cpu()]
            pool, has_pool = self.pool[rows].to(logits.device), self.has_pool[rows].to(logits.device)
            loss, correct = fedgems_fusion_loss(logits, batch["y"], pool, has_pool, ensemble[batch["index"].cpu()].to(logits.device),
                                                self.cfg.epsilon, self.cfg.kl_mode)
            correct = correct.cpu()
            self.pool[rows[correct]] = logits.detach().float().cpu()[correct]
            self.has_pool[rows[correct]] = True
            return loss

        return objective

    def _server_train(self, ctx: RoundContext) -> None:
        public = self.public_subset(ctx)
        ensemble = fedgems_ensemble(self.stacked_uploads(ctx), public.labels)
        self.train_server(ctx, "server_train", public, self.cfg.server_epochs, self._fusion_objective(ctx, ensemble))
        self.record_server_outputs(ctx)
        ctx.aggregate = ctx.server_outputs
        ctx.aggregate_kind = "logits"
        ctx.metrics["protocol/fedgems_pool_fraction"] = float(self.has_pool.float().mean())

    def _distill(self, ctx: RoundContext) -> None:
        public = self.public_subset(ctx)
        objective = fedgems_client(self.cfg.epsilon, self.cfg.kl_mode)
        self.train_clients(ctx, "distill", ctx.participants, lambda k: public, self.cfg.public_epochs, objective, targets=ctx.aggregate)

    def extra_state(self) -> dict:
        return {"pool": self.pool.clone(), "has_pool": self.has_pool.clone()}

    def load_extra_state(self, state: dict) -> None:
        self.pool = state["pool"].clone()
        self.has_pool = state["has_pool"].clone()
