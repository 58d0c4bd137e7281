"""FedAvg with client sampling (Wu et al., ICLR 2024, §2.1, Algorithm 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from fdattack.errors import ConfigError
from fdattack.fd.aggregation import fedavg
from fdattack.fd.protocols.base import PROTOCOLS, Phase, Protocol, RoundContext
from fdattack.fd.protocols.settings import OptimizerName, OptimSettings, ProtocolSettings
from fdattack.fd.record import Upload
from fdattack.fd.threat import ThreatModel
from fdattack.knobs import knob
from fdattack.randomness import derive_seed


def state_bytes(state: dict[str, Tensor]) -> int:
    """Bytes of a model's weights and buffers as stored."""
    return sum(t.numel() * t.element_size() for t in state.values())


@dataclass
class FedAvgSettings(ProtocolSettings):
    """FedAvg's optimizer defaults are the paper's: SGD, lr 0.01, B = 10, a fresh optimizer every round."""

    name: str = "fedavg"
    fraction: float = knob(1.0, "C: fraction of clients sampled per round", gt=0, le=1)
    local_epochs: int = knob(1, "E: local epochs per round", ge=0)
    optim: OptimSettings = knob(
        OptimSettings(name=OptimizerName.sgd, lr=0.01, batch_size=10, fresh_per_phase=True), "optimizer of clients and server"
    )


@PROTOCOLS.register("fedavg")
class FedAvgProtocol(Protocol):
    """Per round: sample m = max(floor(C*K), 1) clients, each starts from the global model, runs E local
    epochs of CE, uploads its weights; the server takes the n_k-weighted mean (float buffers averaged,
    integer buffers take the max). The server handle holds the global model omega_t.
    """

    name = "fedavg"
    Settings = FedAvgSettings
    uploads_outputs = False
    client_accuracy = False
    has_server_model = True
    server_is_client_average = True
    threat_model = ThreatModel(
        attacker="a participating client (white-box access to the global model each round)",
        sees="the global model after every aggregation",
        public_labels_known=False,  # no public set: the attacker has its own prior data
        query_rows="none",
        white_box_global=True,
        sees_uploads=False,
    )

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        archs = set(self.client_archs) | {self.model_cfg.server or self.model_cfg.name}
        if len(archs) > 1:
            raise ConfigError(
                f"protocol.name=fedavg needs one architecture for all clients and the server; model.clients/model.server give "
                f"{sorted(archs)}"
            )

    def participants(self, round: int) -> list[int]:
        m = max(math.floor(self.cfg.fraction * self.num_clients), 1)
        rng = np.random.default_rng(derive_seed(self.seed, "participants", round))
        return sorted(int(k) for k in rng.choice(self.num_clients, size=m, replace=False))

    def public_batch(self, round: int) -> None:
        return None

    def round_phases(self, round: int) -> list[Phase]:
        return [
            Phase("local_train", self._local_train),
            Phase("upload", self._upload),
            Phase("aggregate", self._aggregate, attack_point=True),
        ]

    def _local_train(self, ctx: RoundContext) -> None:
        assert self.server is not None
        global_state = self.server.module.state_dict()
        for k in ctx.participants:
            self.clients[k].module.load_state_dict(global_state)
            ctx.count_bytes("download", state_bytes(global_state))
        self.train_on_private(ctx, "local_train", self.cfg.local_epochs)

    def _upload(self, ctx: RoundContext) -> None:
        for k in ctx.participants:
            state = {name: t.detach().cpu().clone() for name, t in self.clients[k].module.state_dict().items()}
            ctx.uploads[k] = Upload(client=k, kind="weights", state=state, num_samples=len(self.split.private[k]))
            ctx.count_bytes("upload", state_bytes(state))

    def _aggregate(self, ctx: RoundContext) -> None:
        assert self.server is not None
        senders = ctx.senders
        states = [dict(ctx.uploads[k].state) for k in senders]  # type: ignore[arg-type]
        ctx.global_state = fedavg(states, [float(ctx.uploads[k].num_samples) for k in senders])
        self.server.module.load_state_dict(ctx.global_state)
        ctx.aggregate_kind = "weights"
