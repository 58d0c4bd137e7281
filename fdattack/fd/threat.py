"""What a protocol grants its attacker, and the :class:`AttackerView` built from it.

A protocol declares a :class:`ThreatModel`; :func:`attacker_view` turns it and the federated split
into the one object an attack is constructed from. The view holds public knowledge only: the
public images (labels where the protocol gives them, domain flags where the attacker curated the
set), the target labels, the attacker's own prior data where the setting gives one, and the known
degradation that made the public set's insensitive look. Private sets, client models and the
evaluation side's ground truth never enter it; ``tests/test_threat_model.py`` walks its object graph
to prove it. Model access reaches attacks only through the round records: a phase-bound
:class:`~fdattack.fd.record.PublicQuery` (black-box) or ``RoundRecord.global_state`` (white-box, FedAvg).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Literal, Optional

import torch
from torch import Tensor, nn

from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import UNLABELED, ImageSet
from fdattack.models.classifiers import build_classifier
from fdattack.vocabulary import Capability, PayloadKind

#: which public rows a black-box query may ask for: any public row, only the round's rows, or none
QueryRows = Literal["public", "round", "none"]
#: ``images (N, C, H, W) -> their insensitive look``
Degradation = Callable[[Tensor], Tensor]
#: ``(uploads (N, M, J), labels (M,)) -> (M, J)``: a server's aggregate of N clients' uploads on M samples whose public
#: labels are ``labels`` (UNLABELED for an unlabeled row or an attacker's image)
ServerRule = Callable[[Tensor, Tensor], Tensor]


class ViewPart(str, Enum):
    """The parts of an :class:`AttackerView` that hold data (the rest is the protocol's metadata): an attack's own
    view holds only the parts it declares in ``Attack.reads``, and of those only what the threat model grants."""

    public = "public"  #: the public set as the attacker knows it
    prior_data = "prior_data"  #: the attacker's own labeled data
    candidates = "candidates"  #: the membership candidates (copies of private samples)
    aggregation = "aggregation"  #: the server's own aggregation rule

    def __str__(self) -> str:
        return self.value


class UndeclaredPartError(AttributeError):
    """An attack used a part of its view it did not declare in ``Attack.reads``."""


@dataclass(frozen=True)
class Undeclared:
    """Stands in for a view part an attack did not declare: any use of it raises :class:`UndeclaredPartError`, naming
    the attack and the part (None would read as "the protocol gives none")."""

    attack: str
    part: ViewPart

    def _refuse(self) -> UndeclaredPartError:
        return UndeclaredPartError(
            f"attack {self.attack} reads the view's {self.part} without declaring it: add ViewPart.{self.part} to its `reads`"
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe for optional hooks
            raise AttributeError(name)
        raise self._refuse()

    def __bool__(self) -> bool:
        raise self._refuse()

    def __len__(self) -> int:
        raise self._refuse()

    def __getitem__(self, item: Any) -> Any:
        raise self._refuse()


@dataclass(frozen=True)
class ThreatModel:
    """The attacker's vantage point in one protocol (printed at start-up with the protocol's description).

    Attributes:
        attacker: who attacks, e.g. ``"server, honest-but-curious"``.
        sees: what crosses the wire to the attacker.
        public_labels_known: whether the attacker knows the public set's labels (FedMD/FedGEMS yes, DS-FL no).
        public_domains_known: whether it knows which public images are in the sensitive look (PLI's
            ``is_sensitive_flag``: the server curated the public set).
        query_rows: the public rows a query may ask for: ``public`` (any, as the PLI authors' code
            runs FedMD/FedGEMS), ``round`` (the round's rows: what the clients were asked for) or ``none``.
        white_box_global: whether the attacker holds the global model's weights (FedAvg's participating client).
        adversary: the active powers the server has in this protocol (granted to attacks that declare them).
        sees_uploads: whether the records carry the clients' uploads: the server receives them; a participating client
            (FedAvg's attacker) sees only what comes back, never the others' weights or private-set sizes.
    """

    attacker: str
    sees: str
    public_labels_known: bool
    public_domains_known: bool = True
    query_rows: QueryRows = "round"
    white_box_global: bool = False
    adversary: frozenset[Capability] = frozenset()
    sees_uploads: bool = True

    def offers(self, has_server_model: bool) -> frozenset[Capability]:
        """The capabilities an attack can be granted under this threat model."""
        offered = set(self.adversary)
        if self.query_rows != "none":
            offered |= {Capability.public_data, Capability.public_outputs}
            if self.public_labels_known:
                offered.add(Capability.public_labels)
        if has_server_model:
            offered.add(Capability.server_model)
        if self.white_box_global:
            offered.add(Capability.white_box)
        return frozenset(offered)

    def describe(self) -> dict[str, object]:
        """Flat summary for the start-up line and the run config."""
        return {
            "attacker": self.attacker,
            "sees": self.sees,
            "public_labels": "known" if self.public_labels_known else "unknown",
            "query_rows": self.query_rows,
            "white_box_global": self.white_box_global,
            "sees_uploads": self.sees_uploads,
            "adversary": ",".join(sorted(c.value for c in self.adversary)) or "none",
        }


@dataclass(frozen=True)
class ServerAggregation:
    """The server's own aggregation rule (it runs it), which an active server may apply to uploads of its choosing:
    the L-Attack's paper view of a victim's answers and the aggregate made of the victim's own upload (Xiao et al., DSN 2024,
    §IV-B, Algorithm 1). A function of the protocol's settings alone: it holds no model, no data and no protocol.

    Attributes:
        rule: the aggregate of uploads (:data:`ServerRule`), the one the protocol's aggregate phase applies.
        kind: what the clients upload and the rule returns: ``logits`` or ``probs``.
    """

    rule: ServerRule
    kind: PayloadKind


@dataclass(frozen=True)
class AttackerView:
    """Everything an attack is constructed from; nothing in it reaches private data or a client model.

    The run's view holds what the threat model grants; each attack gets its own (:meth:`for_attack`), in which the
    parts that hold data (:class:`ViewPart`: ``public``, ``prior_data``, ``candidates``, ``aggregation``) are there
    only when the attack declares them in ``Attack.reads``.

    Attributes:
        threat: the protocol's declared threat model.
        protocol: protocol name.
        public: the public set as the attacker knows it (labels ``-1`` where unknown; ``source`` is 0..N-1),
            or None where the protocol uses no public data.
        target_labels: L, the labels to reconstruct.
        num_classes: J, the models' output size.
        image_shape: (C, H, W).
        has_server_model: whether the attacker has a server model f_0 to query.
        prior_data: the attacker's own labeled data (FedInverse, L-Attack), or None.
        degradation: the known transform that made the insensitive public look (blur), or None.
        candidates: the samples whose membership the attacker tests (images and labels, in an order that says
            nothing of whose they are; the candidates of Shi et al., PoPETs 2025, §3.3), or None when no membership attack runs.
        architecture: the clients' network name where all clients share one: PDA-FD's attacker copies it for its
            students (Shi et al., PoPETs 2025, §3.3.2); None for heterogeneous clients.
        num_clients: N, how many clients the federation has (the server knows whom it talks to).
        network_changes: the training defenses' changes of the clients' architecture (MID's VIB head), in order: a
            participant knows the model it trains; functions of the defenses' settings alone.
        aggregation: the server's own aggregation rule where the attacker is the server and the protocol declares one
            (FedMD, LabelAvg), else None.
    """

    threat: ThreatModel
    protocol: str
    public: Optional[ImageSet]
    target_labels: tuple[int, ...]
    num_classes: int
    image_shape: tuple[int, int, int]
    has_server_model: bool
    prior_data: Optional[ImageSet] = None
    degradation: Optional[Degradation] = None
    candidates: Optional[ImageSet] = None
    architecture: Optional[str] = None
    num_clients: int = 0
    network_changes: tuple[Callable[[nn.Module], nn.Module], ...] = ()
    aggregation: Optional[ServerAggregation] = None

    def global_network(self) -> nn.Module:
        """A fresh network of the clients' shared architecture as trained, the defenses' changes included: what a
        white-box participant loads ``RoundRecord.global_state`` into (its keys without the module's ``net.`` prefix).

        Raises:
            ValueError: the clients have several architectures.
        """
        if self.architecture is None:
            raise ValueError("the clients have several architectures; there is no one global network")
        c, h, _ = self.image_shape
        with torch.random.fork_rng(devices=[]):  # its initial weights, to be overwritten, leave the run's random stream alone
            net = build_classifier(self.architecture, c, h, self.num_classes)
            for change in self.network_changes:
                net = change(net)
        return net

    def for_attack(self, name: str, reads: frozenset[ViewPart]) -> "AttackerView":
        """Attack ``name``'s own view: of the parts that hold data, only those in ``reads`` (each other part is an
        :class:`Undeclared` that refuses any use), and of the public, prior and candidate sets copies, so that no
        attack writes into another's."""

        def own(part: ViewPart) -> Any:
            if part not in reads:
                return Undeclared(name, part)
            value = getattr(self, part.value)
            return value.copy() if isinstance(value, ImageSet) else value

        return dataclasses.replace(self, **{part.value: own(part) for part in ViewPart})

    @property
    def public_labels_known(self) -> bool:
        return self.threat.public_labels_known

    def sensitive_rows(self) -> Tensor:
        """(N0,) rows of the public set in the sensitive look (D_0); every row when domains are unknown."""
        if self.public is None:
            return torch.empty(0, dtype=torch.long)
        if not self.threat.public_domains_known:
            return torch.arange(len(self.public))
        return torch.nonzero(self.public.domain == 0).flatten()


def _public_as_known(public: ImageSet, threat: ThreatModel) -> ImageSet:
    """A copy of the public set with what the attacker does not know removed (labels, provenance rows): the attacker's
    own copy, so that writing into it changes nothing the clients train on."""
    n = len(public)
    labels = public.labels.clone() if threat.public_labels_known else torch.full((n,), UNLABELED, dtype=torch.long)
    domain = public.domain.clone() if threat.public_domains_known else torch.zeros(n, dtype=torch.long)
    return ImageSet(public.images.clone(), labels, domain, torch.arange(n))


def attacker_view(
    split: FederatedSplit,
    threat: ThreatModel,
    protocol: str,
    has_server_model: bool,
    degradation: Optional[Degradation] = None,
    candidates: Optional[ImageSet] = None,
    architecture: Optional[str] = None,
    network_changes: tuple[Callable[[nn.Module], nn.Module], ...] = (),
    aggregation: Optional[ServerAggregation] = None,
) -> AttackerView:
    """Build the view an attack of ``protocol`` gets from the split, per ``threat``.

    Args:
        split: the federated data (read here; never handed on).
        threat: what the protocol grants.
        protocol: protocol name.
        has_server_model: whether the configuration trains a server model f_0.
        degradation: the transform that made the insensitive public look, where it is known.
        candidates: the membership candidates as the attacker knows them (no origin), or None.
        architecture: the clients' shared network name, or None.
        network_changes: the training defenses' changes of the clients' architecture.
        aggregation: the server's aggregation rule (:meth:`~fdattack.fd.protocols.base.Protocol.aggregation`), or None.
    """
    public = None if threat.query_rows == "none" else _public_as_known(split.public, threat)
    prior = None
    # with data.split=classes the prior data is the public set with its labels: a protocol whose attacker knows the
    # public set but not its labels (DS-FL, Cronus) gives no prior, or the labels would come in through it
    labels_through_prior = split.attacker is split.public and public is not None and not threat.public_labels_known
    if split.attacker is not None and not labels_through_prior:
        prior = ImageSet(
            split.attacker.images.clone(), split.attacker.labels.clone(), split.attacker.domain.clone(), torch.arange(len(split.attacker))
        )
    return AttackerView(
        threat=threat,
        protocol=protocol,
        public=public,
        target_labels=tuple(int(j) for j in split.target_labels),
        num_classes=split.num_classes,
        image_shape=split.image_shape,
        has_server_model=has_server_model,
        prior_data=prior,
        degradation=degradation,
        candidates=candidates,
        architecture=architecture,
        num_clients=len(split.private),
        network_changes=tuple(network_changes),
        aggregation=aggregation,
    )
