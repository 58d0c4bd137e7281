"""The protocol contract: named phases per round, acting on a mutable :class:`RoundContext`.

A protocol owns its clients (and server model, where it has one), all of them
:class:`~fdattack.lit.ClassifierLitModule` set up by the :class:`~fdattack.engine.trainer.LocalTrainer`.
It never imports an attack; the orchestrator publishes a :class:`~fdattack.fd.record.RoundRecord`
after each phase. What its clients' outputs become on the wire (uploads, query answers) is made in
:mod:`fdattack.fd.uploads`; the protocol decides who uploads and what a query may reach.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Sequence

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from fdattack.data import partitions
from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import UNLABELED, ImageSet
from fdattack.defenses.base import Defense, NetworkChange, TrainingDefense, UploadDefense, dense_bytes
from fdattack.engine import FitJob, LocalTrainer, ModelHandle
from fdattack.errors import ConfigError
from fdattack.fd.adversary import Adversary, ImageGrant, checked_aggregate, checked_images, checked_rows
from fdattack.fd.answering import Desk, Refusal
from fdattack.fd.evasion import Evasion, evasive_clients
from fdattack.fd.protocols.settings import ProtocolSettings
from fdattack.fd.record import PublicBatch, PublicQuery, QueryRefusedError, StaleQueryError, Upload, open_query
from fdattack.fd.threat import Capability, ServerAggregation, ThreatModel
from fdattack.fd.uploads import PublicDigests, QueryAnswerer, client_uploads
from fdattack.lit.classifier import ClassifierLitModule, Objective, cross_entropy
from fdattack.models import build_classifier
from fdattack.randomness import GlobalStreams, derive_seed
from fdattack.registry import Registry
from fdattack.vocabulary import PayloadKind

#: opens one attack's :class:`PublicQuery` for an open phase (by the attack's name): the query and the protocol's end of it
QueryOpener = Callable[[str], tuple[PublicQuery, Desk]]


@dataclass
class RoundContext:
    """Mutable state of one round, shared by its phases and snapshotted into records."""

    round: int
    participants: list[int]
    batch: PublicBatch | None = None
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

    def count_bytes(self, direction: str, size: int) -> None:
        """Add ``size`` bytes to ``comm/upload_bytes`` or ``comm/download_bytes`` of this round."""
        key = f"comm/{direction}_bytes"
        self.metrics[key] = self.metrics.get(key, 0.0) + float(size)


@dataclass(frozen=True)
class Phase:
    """A named step of a round. ``attack_point`` marks where passive attacks run (PLI's: Takahashi et al., CVPR 2023, Algorithm 1)."""

    name: str
    run: Callable[[RoundContext], None]
    attack_point: bool = False


class Protocol(ABC):
    """Base class of FedMD, FedGEMS, DS-FL, Cronus and FedAvg.

    Args:
        cfg: the ``protocol`` config node (the protocol's own :attr:`Settings` dataclass).
        model_cfg: the ``model`` config node.
        split: the federated data (public, private per client, test).
        engine: the trainer every phase goes through.
        seed: the run seed; every random draw derives from it, round and phase.
        defenses: upload defenses (applied in order to every payload a client releases) and training
            defenses (wrapping every client's network, objective and optimizer).
    """

    name: ClassVar[str]
    #: the protocol's config dataclass (``protocol.*`` keys; its defaults live there)
    Settings: ClassVar[type[ProtocolSettings]]
    has_server_model: ClassVar[bool] = False
    #: whether clients upload outputs on public data (FedAvg uploads weights)
    uploads_outputs: ClassVar[bool] = True
    #: whether ``protocol/client_acc_*`` are measured each round (FedAvg's clients only hold the global model plus
    #: the local epochs of the round they last joined; its utility is the server's accuracy)
    client_accuracy: ClassVar[bool] = True
    #: what the attacker is granted (printed at start-up; the attacker's view and queries are built from it)
    threat_model: ClassVar[ThreatModel]
    #: capability -> the override that turns it on, for capabilities that depend on this protocol's config
    enable_hints: ClassVar[dict[Capability, str]] = {}
    #: the server model is the clients' average (FedAvg): it has their architecture, training defenses' changes included
    server_is_client_average: ClassVar[bool] = False

    def __init__(
        self,
        cfg: DictConfig,
        model_cfg: DictConfig,
        split: FederatedSplit,
        engine: LocalTrainer,
        seed: int,
        defenses: Sequence[Defense] = (),
    ) -> None:
        self.cfg = cfg
        self.model_cfg = model_cfg
        self.split = split
        self.engine = engine
        self.seed = seed
        self.num_clients = int(cfg.num_clients)
        if len(split.private) != self.num_clients:
            raise ConfigError(f"protocol.num_clients={self.num_clients} but the data has {len(split.private)} private sets")
        #: every defense, in the configured order (their metrics and states)
        self.defenses = tuple(defenses)
        #: applied, in order, to every payload a client sends and to every query answer
        self.upload_defenses = tuple(d for d in defenses if isinstance(d, UploadDefense))
        self.training_defenses = tuple(d for d in defenses if isinstance(d, TrainingDefense))
        #: defense name -> its change of the architecture (MID's VIB head), applied to every client's network
        self.network_changes: dict[str, NetworkChange] = {
            d.name: change for d in self.training_defenses if (change := d.network_change()) is not None
        }
        #: the active powers granted to attacks (:meth:`grant_adversary`), and the protocol's own record of each grant
        #: (what it takes from an adversary is checked against this, not against the adversary's ``powers``)
        self.adversaries: list[Adversary] = []
        self.grants: list[frozenset[Capability]] = []
        self.desks: list[Desk | None] = []  # the protocol's ends of the adversaries' query lines
        archs = list(model_cfg.clients) or [model_cfg.name]
        self.client_archs = [archs[k % len(archs)] for k in range(self.num_clients)]
        self.clients = [self._make_model(f"client{k}", self.client_archs[k], client=k) for k in range(self.num_clients)]
        self.server: ModelHandle | None = None
        if self.server_model_enabled(cfg):
            self.server = self._make_model("server", model_cfg.server or model_cfg.name)
        evasive = evasive_clients(cfg.evasive_clients, self.num_clients, self.uploads_outputs)
        #: what the evasive clients withhold (Shi et al., PoPETs 2025, §5.5), or None where every client answers everything
        self.evasion = (
            Evasion({k: split.private[k].images for k in sorted(evasive)}, derive_seed(seed, "evasion"), float(cfg.evasion_decoys))
            if evasive
            else None
        )
        #: the public images' digests, read by the evasive clients (protocol-side, computed on first use)
        self._public_digests = PublicDigests(split.public.images)

    # ------------------------------------------------------------------ what the protocol offers
    @classmethod
    def server_model_enabled(cls, cfg: DictConfig) -> bool:
        """Whether this configuration trains a server model f_0."""
        return cls.has_server_model

    @classmethod
    def offers(cls, cfg: DictConfig) -> frozenset[Capability]:
        """What attacks and defenses can be granted in this configuration (checked against their needs)."""
        offered = set(cls.threat_model.offers(cls.server_model_enabled(cfg)))
        if cls.uploads_outputs:
            offered.add(Capability.output_uploads)
        if cls.aggregation is not Protocol.aggregation:  # a protocol that declares its server's rule
            offered.add(Capability.aggregation_rule)
        return frozenset(offered)

    def grant_adversary(self, powers: frozenset[Capability]) -> Adversary:
        """An :class:`Adversary` with ``powers`` (a subset of what the threat model gives the server)."""
        refused = powers - self.threat_model.adversary
        if refused:
            raise ConfigError(f"protocol.name={self.name} gives the server no {', '.join(sorted(p.value for p in refused))}")
        desk = None
        if Capability.query_chosen_batch in powers:
            desk = Desk(Refusal(StaleQueryError, "the adversary can query clients only while a phase is open (from on_record)", final=True))
        adversary = Adversary(frozenset(powers), len(self.split.public), self.split.image_shape, None if desk is None else desk.line)
        self.adversaries.append(adversary)
        self.grants.append(frozenset(powers))
        self.desks.append(desk)
        return adversary

    def _granted(self, index: int, power: Capability) -> None:
        """Refuse what adversary ``index`` queued without the power (checked on the protocol's side)."""
        if power not in self.grants[index]:
            raise QueryRefusedError(
                f"an attack used {power.value}, which it was not granted (it has: "
                f"{', '.join(sorted(p.value for p in self.grants[index])) or 'nothing'})"
            )

    # ------------------------------------------------------------------ construction
    def _make_model(self, name: str, arch: str, client: int | None = None) -> ModelHandle:
        """A classifier set up by the engine, initialised from global streams of its own (seeded from the run seed and
        ``name``), so that the global generators outside hold nothing of its initial weights."""
        with GlobalStreams(derive_seed(self.seed, "init", name)).active():
            return self._build_model(name, arch, client)

    def _build_model(self, name: str, arch: str, client: int | None) -> ModelHandle:
        """:meth:`_make_model`'s classifier; a client's network and optimizer go through the training defenses, and
        the training defenses' :attr:`network_changes` apply to the clients' and to a server that averages them."""
        c, h, _ = self.split.image_shape
        try:
            net = build_classifier(arch, c, h, self.split.num_classes)
        except ValueError as err:
            raise ConfigError(f"model {arch!r} for {name}: {err} (see data.image_size)") from None
        key = self._arch_key(client) if client is not None else "model.server" if self.model_cfg.server else "model.name"
        changes = self.network_changes if client is not None or self.server_is_client_average else {}
        for defense_name, change in changes.items():
            try:
                net = change(net)
            except ValueError as err:
                raise ConfigError(f"defense {defense_name}: {key}={arch} {err}") from None
        defenses = self.training_defenses if client is not None else ()
        for defense in defenses:
            try:
                net = defense.wrap_network(client, net)  # type: ignore[arg-type]
            except ValueError as err:
                raise ConfigError(f"defense {defense.name}: {key}={arch} {err}") from None
        optim = self.cfg.optim
        module = ClassifierLitModule(
            net,
            self.split.num_classes,
            optimizer=str(optim.name),
            lr=optim.lr,
            weight_decay=optim.weight_decay,
            momentum=optim.momentum,
            nesterov=optim.nesterov,
        )
        wrap = None
        if defenses:

            def wrap(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
                for defense in defenses:
                    optimizer = defense.wrap_optimizer(client, optimizer)  # type: ignore[arg-type]
                return optimizer

        return self.engine.setup(name, module, wrap_optimizer=wrap)

    def _arch_key(self, client: int) -> str:
        """The config key that chose client ``client``'s architecture: ``model.name`` or ``model.clients[i]``."""
        listed = len(self.model_cfg.clients)
        return f"model.clients[{client % listed}]" if listed else "model.name"

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

    def public_rows(self, round: int) -> Tensor:
        """Public rows drawn for ``round`` (S_t): all, or ``public_per_round`` without replacement, evenly over the
        labels with ``public_stratified`` where the server's public set is labeled (Shi et al., PoPETs 2025, §3.2); sorted."""
        public = self.split.public
        n, m = len(public), self.cfg.public_per_round
        if m is None or m >= n:
            return torch.arange(n)
        rng = np.random.default_rng(derive_seed(self.seed, "public", round))
        if self.cfg.public_stratified and bool((public.labels != UNLABELED).all()):
            return torch.as_tensor(partitions.balanced_sample(public.labels.numpy(), int(m), rng), dtype=torch.long)
        return torch.as_tensor(np.sort(rng.choice(n, size=int(m), replace=False)), dtype=torch.long)

    def public_batch(self, round: int) -> PublicBatch | None:
        """The round's public samples: the protocol's draw, or the rows an adversary chose, plus any images it added."""
        rows, added = self.public_rows(round), []
        for index, adversary in enumerate(self.adversaries):
            chosen, extra = adversary.take_public_choice()
            if chosen is not None:
                self._granted(index, Capability.choose_public_batch)
                rows = checked_rows(chosen, len(self.split.public))
            if extra is not None:
                self._granted(index, Capability.add_public_samples)
                added.append(checked_images(extra, self.split.image_shape))
        return PublicBatch(rows, torch.cat(added) if added else None)

    # ------------------------------------------------------------------ helpers for phases
    def seed_for(self, round: int, phase: str, model: str | int) -> int:
        return derive_seed(self.seed, round, phase, model)

    def public_subset(self, ctx: RoundContext) -> ImageSet:
        """The round's public samples as an image set: the chosen rows, then the added images (unlabeled)."""
        assert ctx.batch is not None
        subset = self.split.public.subset(ctx.batch.rows)
        if ctx.batch.added is None:
            return subset
        return subset.concat(ImageSet.from_images(ctx.batch.added, torch.full((ctx.batch.num_added,), UNLABELED, dtype=torch.long)))

    def _objective_for(self, client: int, objective: Objective) -> Objective:
        for defense in self.training_defenses:
            objective = defense.wrap_objective(client, objective)
        return objective

    def train_clients(
        self,
        ctx: RoundContext,
        phase: str,
        clients: list[int],
        data: Callable[[int], ImageSet],
        epochs: int,
        objective: Objective,
        targets: Tensor | Callable[[int], Tensor] | None = None,
    ) -> None:
        """Train ``clients`` (each on ``data(k)``, with soft targets ``targets`` or ``targets(k)``) in one engine call;
        each client's job goes through the training defenses' :meth:`~TrainingDefense.wrap_job` for ``phase``."""
        fresh = bool(self.cfg.optim.fresh_per_phase)
        jobs = []
        for k in clients:
            job = FitJob(
                self.clients[k],
                data(k),
                epochs,
                self._objective_for(k, objective),
                self.seed_for(ctx.round, phase, k),
                targets=targets(k) if callable(targets) else targets,
                fresh_optimizer=fresh,
            )
            for defense in self.training_defenses:
                job = defense.wrap_job(k, phase, job, self.engine.batch_size)
            jobs.append(job)
        results = self.engine.fit_many(jobs)
        losses = [r.mean_loss for r in results if r.steps]
        if losses:
            ctx.metrics[f"protocol/{phase}_loss"] = float(np.mean(losses))

    def train_on_private(self, ctx: RoundContext, phase: str, epochs: int) -> None:
        """Train the round's participants on their own private sets for ``epochs`` epochs of cross-entropy (:meth:`train_clients`)."""
        self.train_clients(ctx, phase, ctx.participants, lambda k: self.split.private[k], epochs, cross_entropy)

    def train_server(
        self, ctx: RoundContext, phase: str, data: ImageSet, epochs: int, objective: Objective, targets: Tensor | None = None
    ) -> None:
        assert self.server is not None
        job = FitJob(
            self.server,
            data,
            epochs,
            objective,
            self.seed_for(ctx.round, phase, "server"),
            targets=targets,
            fresh_optimizer=bool(self.cfg.optim.fresh_per_phase),
        )
        result = self.engine.fit(job)
        if result.steps:
            ctx.metrics[f"protocol/{phase}_loss"] = result.mean_loss

    def aggregate_for(self, ctx: RoundContext) -> Callable[[int], Tensor]:
        """``k -> what client k receives``: the round's aggregate, or the one an adversary chose for k; counts the download."""
        assert ctx.aggregate is not None
        aggregate = ctx.aggregate

        def received(k: int) -> Tensor:
            chosen = None
            for index, adversary in enumerate(self.adversaries):
                queued = adversary.aggregate_for(k)
                if queued is not None:
                    self._granted(index, Capability.send_aggregate)
                    chosen = checked_aggregate(queued)
                    break
            if chosen is not None and chosen.shape != aggregate.shape:
                raise ValueError(
                    f"round {ctx.round}: the aggregate chosen for client {k} has shape {tuple(chosen.shape)}, "
                    f"the protocol's has {tuple(aggregate.shape)}"
                )
            sent = aggregate if chosen is None else chosen
            ctx.count_bytes("download", dense_bytes(sent))
            return sent

        return received

    def upload_kind(self) -> tuple[PayloadKind, float]:
        """What clients send on public samples: ``("logits", 1.0)`` or ``("probs", temperature)``."""
        return "logits", 1.0

    def aggregation(self) -> ServerAggregation | None:
        """The server's aggregation rule as the attacking server knows it (:attr:`AttackerView.aggregation
        <fdattack.fd.threat.AttackerView.aggregation>`), or None where the protocol does not declare one."""
        return None

    def upload_outputs(self, ctx: RoundContext) -> None:
        """Every participant sends its outputs on the round's public samples, through the upload defenses; an evasive
        client withholds some rows (:mod:`fdattack.fd.evasion`), counted in ``protocol/withheld_rows``
        (:func:`~fdattack.fd.uploads.client_uploads`)."""
        assert ctx.batch is not None
        kind, temperature = self.upload_kind()
        logits = self.engine.predict_many([self.clients[k] for k in ctx.participants], self.public_subset(ctx))
        for upload, size, withheld in client_uploads(
            logits, ctx.participants, ctx.batch, ctx.round, kind, temperature, self.upload_defenses, self.evasion, self._public_digests
        ):
            ctx.count_bytes("upload", size)
            if withheld:
                ctx.metrics["protocol/withheld_rows"] = ctx.metrics.get("protocol/withheld_rows", 0.0) + float(withheld)
            ctx.uploads[upload.client] = upload

    def aggregate_uploads(self, ctx: RoundContext, rule: Callable[[Tensor, Tensor], Tensor], kind: PayloadKind) -> Tensor:
        """(N, J) aggregate of the accepted uploads: ``rule(outputs (K', N', J), rows (N',))`` -> (N', J).

        Each row is aggregated over the clients that answered it: with every row answered, ``rule`` sees all uploads
        on all rows; else the rows are grouped by who answered them. A row no client answered gets the uninformative
        aggregate, zero logits or uniform probabilities (``kind``), counted in ``protocol/unanswered_rows``.
        """
        replies = [ctx.uploads[k].reply() for k in ctx.senders]
        outputs = torch.stack([r.outputs for r in replies])
        answered = torch.stack([r.answered for r in replies])
        n, j = outputs.shape[1:]
        if bool(answered.all()):
            return rule(outputs, torch.arange(n))
        aggregate = outputs.new_zeros(n, j) if kind == "logits" else outputs.new_full((n, j), 1.0 / j)
        patterns, group = torch.unique(answered.T, dim=0, return_inverse=True)
        for i, pattern in enumerate(patterns):
            rows = torch.nonzero(group == i).flatten()
            if bool(pattern.any()):
                aggregate[rows] = rule(outputs[pattern][:, rows], rows).to(aggregate.dtype)
            else:
                ctx.metrics["protocol/unanswered_rows"] = float(len(rows))
        return aggregate

    def record_server_outputs(self, ctx: RoundContext) -> None:
        if self.server is not None:
            ctx.server_outputs = self.engine.predict(self.server, self.public_subset(ctx))

    # ------------------------------------------------------------------ attacker's black-box view
    def open_phase(self, ctx: RoundContext, phase: str) -> QueryOpener | None:
        """Query access for the record of ``phase``: opens the adversaries' queries on chosen images and returns what
        opens each attack's :class:`PublicQuery` on the rows :attr:`threat_model` grants, both for the round's clients.

        The answerer holds the queried networks (the plain ``net`` of each LightningModule, which, unlike the
        module, references neither Fabric nor the protocol's objectives), the public images and the upload
        defenses: never the protocol, its data or its engine; only the answering threads hold it
        (:mod:`fdattack.fd.answering`). :meth:`close_phase` stops the adversaries'.
        """
        grant = self.threat_model.query_rows
        if grant == "none":
            return None
        if grant == "round":  # the rows the clients were asked for this round; none in the set-up phases
            rows = ctx.batch.rows if ctx.batch is not None else torch.empty(0, dtype=torch.long)
        else:
            rows = torch.arange(len(self.split.public))
        kind, temperature = self.upload_kind()
        answer = QueryAnswerer(
            {k: self.clients[k].module.net for k in ctx.participants},
            None if self.server is None else self.server.module.net,
            self.split.public.images,
            self.upload_defenses,
            kind,
            temperature,
            ctx.round,
            phase,
            self.engine.fabric.device,
            self.engine.predict_batch_size,
            self.evasion,
        )
        images = ImageGrant(ctx.round, tuple(ctx.participants), tuple(self.split.image_shape))
        for desk in self.desks:
            if desk is not None:
                desk.open(functools.partial(images.answer, answer.on_images))
        return functools.partial(
            open_query,
            answer,
            round=ctx.round,
            phase=phase,
            rows=rows,
            clients=tuple(ctx.participants),
            has_server=self.server is not None,
            kind=kind,
            temperature=temperature,
        )

    def close_phase(self) -> None:
        """End the adversaries' query access (each attack's query is closed after its ``on_record``)."""
        for desk in self.desks:
            if desk is not None:
                desk.close()

    def defense_metrics(self) -> dict[str, float]:
        """Every defense's :meth:`~fdattack.defenses.base.Defense.round_metrics`, as ``defense/<name>/<key>``."""
        return {f"defense/{d.name}/{key}": value for d in self.defenses for key, value in d.round_metrics().items()}

    # ------------------------------------------------------------------ persistence
    def extra_state(self) -> dict:
        """Protocol state beyond the models (e.g. FedGEMS' knowledge pool)."""
        return {}

    def load_extra_state(self, state: dict) -> None:  # noqa: B027 - an optional hook: most protocols keep no extra state
        """Restore :meth:`extra_state`."""

    def state_dict(self) -> dict:
        return {
            "clients": [h.state_dict() for h in self.clients],
            "server": None if self.server is None else self.server.state_dict(),
            "extra": self.extra_state(),
            "adversaries": [a.state_dict() for a in self.adversaries],
            "defenses": {d.name: d.state_dict() for d in self.defenses},
        }

    def load_state_dict(self, state: dict) -> None:
        for handle, s in zip(self.clients, state["clients"], strict=True):
            handle.load_state_dict(s)
        if self.server is not None:
            self.server.load_state_dict(state["server"])
        self.load_extra_state(state["extra"])
        for adversary, queued in zip(self.adversaries, state.get("adversaries", []), strict=False):
            adversary.load_state_dict(queued)
        saved = state.get("defenses", {})
        for defense in self.defenses:
            if defense.name in saved:
                defense.load_state_dict(saved[defense.name])

    def describe(self) -> dict[str, object]:
        """The self-describing threat model and shape of this protocol (printed at start-up)."""
        return {
            "protocol": self.name,
            "clients": self.num_clients,
            "client_architectures": sorted(set(self.client_archs)),
            "server_model": self.server is not None,
            "evasive_clients": sorted(self.evasion.clients) if self.evasion is not None else [],
            **({"evasion_decoys": self.evasion.decoys} if self.evasion is not None else {}),
            "defenses": "; ".join(d.describe() for d in self.defenses) or "none",
            **self.threat_model.describe(),
        }


PROTOCOLS: Registry[type[Protocol]] = Registry("protocol", "protocol.name")
