"""The protocol contract: named phases per round, acting on a mutable :class:`RoundContext`.

A protocol owns its clients (and server model, where it has one), all of them
:class:`~fdattack.lit.ClassifierLitModule` set up by the :class:`~fdattack.fd.engine.LocalTrainer`.
It never imports an attack; the orchestrator publishes a :class:`~fdattack.fd.record.RoundRecord`
after each phase.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import ImageSet
from fdattack.errors import ConfigError
from fdattack.fd.engine import FitJob, LocalTrainer, ModelHandle, derive_seed, predict_logits
from fdattack.fd.record import PayloadKind, PublicQuery, Upload
from fdattack.fd.threat import ThreatModel
from fdattack.lit.classifier import ClassifierLitModule, Objective
from fdattack.models import build_classifier
from fdattack.registry import Registry


@dataclass
class RoundContext:
    """Mutable state of one round, shared by its phases and snapshotted into records."""

    round: int
    participants: list[int]
    public_indices: Tensor | None = None
    uploads: dict[int, Upload] = field(default_factory=dict)
    aggregate: Tensor | None = None
    aggregate_kind: str | None = None
    global_state: dict[str, Tensor] | None = None
    server_outputs: Tensor | None = None
    dropped: list[int] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def senders(self) -> list[int]:
        """Participants whose upload was accepted, in client order."""
        return [k for k in self.participants if k in self.uploads]


@dataclass(frozen=True)
class Phase:
    """A named step of a round. ``attack_point`` marks where passive attacks run (pli.md §5)."""

    name: str
    run: Callable[[RoundContext], None]
    attack_point: bool = False


class Protocol(ABC):
    """Base class of FedMD, FedGEMS, DS-FL, Cronus and FedAvg.

    Args:
        cfg: the ``protocol`` config node (its dataclass is chosen by ``protocol.name``).
        model_cfg: the ``model`` config node.
        split: the federated data (public, private per client, test).
        engine: the trainer every phase goes through.
        seed: the run seed; every random draw derives from it, round and phase.
    """

    name: ClassVar[str]
    has_server_model: ClassVar[bool] = False
    #: what the attacker is granted (printed at start-up; the attacker's view and queries are built from it)
    threat_model: ClassVar[ThreatModel]

    def __init__(self, cfg: DictConfig, model_cfg: DictConfig, split: FederatedSplit, engine: LocalTrainer, seed: int) -> None:
        self.cfg = cfg
        self.model_cfg = model_cfg
        self.split = split
        self.engine = engine
        self.seed = seed
        self.num_clients = int(cfg.num_clients)
        if len(split.private) != self.num_clients:
            raise ConfigError(f"protocol.num_clients={self.num_clients} but the data has {len(split.private)} private sets")
        archs = list(model_cfg.clients) or [model_cfg.name]
        self.client_archs = [archs[k % len(archs)] for k in range(self.num_clients)]
        self.clients = [self._make_model(f"client{k}", self.client_archs[k]) for k in range(self.num_clients)]
        self.server: ModelHandle | None = None
        if self.uses_server_model():
            self.server = self._make_model("server", model_cfg.server or model_cfg.name)
        #: transforms applied, in order, to every payload a client sends and to every query answer
        self.upload_transforms: list[UploadTransform] = []

    # ------------------------------------------------------------------ construction
    def uses_server_model(self) -> bool:
        """Whether this configuration trains a server model f_0."""
        return self.has_server_model

    def _make_model(self, name: str, arch: str) -> ModelHandle:
        torch.manual_seed(derive_seed(self.seed, "init", name))
        c, h, _ = self.split.image_shape
        try:
            net = build_classifier(arch, c, h, self.split.num_classes)
        except ValueError as err:
            raise ConfigError(f"model {arch!r} for {name}: {err} (see data.image_size)") from None
        optim = self.cfg.optim
        module = ClassifierLitModule(
            net, self.split.num_classes, optimizer=optim.name, lr=optim.lr, weight_decay=optim.weight_decay,
            momentum=optim.momentum, nesterov=optim.nesterov,
        )
        return self.engine.setup(name, module)

    # ------------------------------------------------------------------ schedule
    def setup_phases(self) -> list[Phase]:
        """Phases run once before round 1 (FedMD's transfer learning, warm-up epochs)."""
        return []

    @abstractmethod
    def round_phases(self, round: int) -> list[Phase]:
        """The ordered phases of round ``round`` (1-based)."""

    def participants(self, round: int) -> list[int]:
        """Clients taking part in ``round`` (all of them unless the protocol samples)."""
        return list(range(self.num_clients))

    def public_indices(self, round: int) -> Tensor:
        """Public rows used in ``round``: all, or ``public_per_round`` drawn without replacement (sorted)."""
        n = len(self.split.public)
        m = self.cfg.public_per_round
        if m is None or m >= n:
            return torch.arange(n)
        rng = np.random.default_rng(derive_seed(self.seed, "public", round))
        return torch.as_tensor(np.sort(rng.choice(n, size=int(m), replace=False)), dtype=torch.long)

    # ------------------------------------------------------------------ helpers for phases
    def seed_for(self, round: int, phase: str, model: str | int) -> int:
        return derive_seed(self.seed, round, phase, model)

    def public_subset(self, ctx: RoundContext) -> ImageSet:
        assert ctx.public_indices is not None
        return self.split.public.subset(ctx.public_indices)

    def train_clients(self, ctx: RoundContext, phase: str, clients: list[int], data: Callable[[int], ImageSet], epochs: int,
                      objective: Objective, targets: Tensor | Callable[[int], Tensor] | None = None) -> None:
        """Train ``clients`` (each on ``data(k)``, with soft targets ``targets`` or ``targets(k)``) in one engine call."""
        fresh = bool(self.cfg.optim.fresh_per_phase)
        jobs = [
            FitJob(self.clients[k], data(k), epochs, objective, self.seed_for(ctx.round, phase, k),
                   targets=targets(k) if callable(targets) else targets, fresh_optimizer=fresh)
            for k in clients
        ]
        results = self.engine.fit_many(jobs)
        losses = [r.mean_loss for r in results if r.steps]
        if losses:
            ctx.metrics[f"protocol/{phase}_loss"] = float(np.mean(losses))

    def train_server(self, ctx: RoundContext, phase: str, data: ImageSet, epochs: int, objective: Objective,
                     targets: Tensor | None = None) -> None:
        assert self.server is not None
        job = FitJob(self.server, data, epochs, objective, self.seed_for(ctx.round, phase, "server"), targets=targets,
                     fresh_optimizer=bool(self.cfg.optim.fresh_per_phase))
        result = self.engine.fit(job)
        if result.steps:
            ctx.metrics[f"protocol/{phase}_loss"] = result.mean_loss

    def upload_kind(self) -> tuple[PayloadKind, float]:
        """What clients send on public samples: ``("logits", 1.0)`` or ``("probs", temperature)``."""
        return "logits", 1.0

    def sent_outputs(self, client: int, logits: Tensor) -> Tensor:
        """Client ``client``'s logits as it sends them: in :meth:`upload_kind`, through :attr:`upload_transforms`."""
        return as_sent(client, logits, *self.upload_kind(), tuple(self.upload_transforms))

    def upload_outputs(self, ctx: RoundContext) -> None:
        """Every participant sends its outputs on the round's public samples, as :meth:`sent_outputs` makes them."""
        kind, temperature = self.upload_kind()
        public = self.public_subset(ctx)
        logits = self.engine.predict_many([self.clients[k] for k in ctx.participants], public)
        for row, k in enumerate(ctx.participants):
            out = self.sent_outputs(k, logits[row])
            ctx.uploads[k] = Upload(client=k, kind=kind, public_indices=ctx.public_indices, outputs=out, temperature=temperature)

    def stacked_uploads(self, ctx: RoundContext) -> Tensor:
        """(K', N, J) outputs of the accepted uploads."""
        return torch.stack([ctx.uploads[k].outputs for k in ctx.senders])  # type: ignore[misc]

    def record_server_outputs(self, ctx: RoundContext) -> None:
        if self.server is not None:
            ctx.server_outputs = self.engine.predict(self.server, self.public_subset(ctx))

    # ------------------------------------------------------------------ attacker's black-box view
    def public_query(self, ctx: RoundContext, phase: str) -> PublicQuery | None:
        """A query handle for the record of ``phase``: the rows :attr:`threat_model` grants, the round's clients.

        The answer function holds the queried networks (the plain ``net`` of each LightningModule, which,
        unlike the module, references neither Fabric nor the protocol's objectives), the public images and
        the upload transforms: never the protocol, its data or its engine. The orchestrator closes the
        handle when the phase ends, and with it the last reference to the networks.
        """
        grant = self.threat_model.query_rows
        if grant == "none":
            return None
        rows = ctx.public_indices if grant == "round" and ctx.public_indices is not None else torch.arange(len(self.split.public))
        kind, temperature = self.upload_kind()
        answer = _QueryAnswerer(
            {k: self.clients[k].module.net for k in ctx.participants},
            None if self.server is None else self.server.module.net,
            self.split.public.images, tuple(self.upload_transforms), kind, temperature,
            self.engine.fabric.device, self.engine.predict_batch_size,
        )
        return PublicQuery(answer, ctx.round, phase, rows, tuple(ctx.participants), self.server is not None, kind, temperature)

    # ------------------------------------------------------------------ persistence
    def extra_state(self) -> dict:
        """Protocol state beyond the models (e.g. FedGEMS' knowledge pool)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        """Restore :meth:`extra_state`."""

    def state_dict(self) -> dict:
        return {
            "clients": [h.state_dict() for h in self.clients],
            "server": None if self.server is None else self.server.state_dict(),
            "extra": self.extra_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        for handle, s in zip(self.clients, state["clients"], strict=True):
            handle.load_state_dict(s)
        if self.server is not None:
            self.server.load_state_dict(state["server"])
        self.load_extra_state(state["extra"])

    def describe(self) -> dict[str, object]:
        """The self-describing threat model and shape of this protocol (printed at start-up)."""
        return {
            "protocol": self.name,
            "clients": self.num_clients,
            "client_architectures": sorted(set(self.client_archs)),
            "server_model": self.server is not None,
            **self.threat_model.describe(),
        }


#: ``(client, payload, kind) -> payload`` applied to what a client sends (defenses such as noise on logits)
UploadTransform = Callable[[int, Tensor, PayloadKind], Tensor]


def as_sent(client: int, logits: Tensor, kind: PayloadKind, temperature: float, transforms: tuple[UploadTransform, ...]) -> Tensor:
    """(N, J) logits of ``client`` turned into its payload: raw or softmax at ``temperature``, then each transform."""
    out = logits if kind == "logits" else torch.softmax(logits / temperature, dim=-1)
    for transform in transforms:
        out = transform(client, out, kind)
    return out


class _QueryAnswerer:
    """Answers :class:`PublicQuery` calls from the queried networks alone, as the clients would send their outputs."""

    def __init__(self, clients: dict[int, torch.nn.Module], server: torch.nn.Module | None, public_images: Tensor,
                 transforms: tuple[UploadTransform, ...], kind: PayloadKind, temperature: float, device: torch.device, batch_size: int) -> None:
        self.clients = clients
        self.server = server
        self.public_images = public_images
        self.transforms = transforms
        self.kind = kind
        self.temperature = temperature
        self.device = device
        self.batch_size = batch_size

    def __call__(self, model: int | str, rows: Tensor) -> Tensor:
        images = self.public_images[rows]
        if model == "server":
            assert self.server is not None
            return predict_logits(self.server, images, self.device, self.batch_size)
        logits = predict_logits(self.clients[int(model)], images, self.device, self.batch_size)
        return as_sent(int(model), logits, self.kind, self.temperature, self.transforms)


PROTOCOLS: Registry[type[Protocol]] = Registry("protocol", "protocol.name")
