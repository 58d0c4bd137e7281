"""The defense contract: :class:`UploadDefense` (what a client sends) and :class:`TrainingDefense` (how it trains).

Defenses are picked by name (``defenses=[laplace, topk]``), each with its knobs under
``defense.<name>`` (its ``Settings`` dataclass), and compose in the listed order. An upload defense
transforms every payload a client releases on public data, the round's upload and every answer to
a query alike, so an attack never sees an undefended output. A training defense wraps a client's
network, objective or optimizer, or one phase's training job (DP-SGD, MID and BiDO are of this kind).

A defense may report metrics after every round (:meth:`Defense.round_metrics`, logged as
``defense/<name>/<metric>``, e.g. DP-SGD's ε) and keep state across rounds that checkpoints save
(:meth:`Defense.state_dict`).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch
from torch import Tensor, nn

from fdattack.lit.classifier import Objective
from fdattack.registry import Registry
from fdattack.vocabulary import Capability, PayloadKind

if TYPE_CHECKING:
    from fdattack.engine import FitJob

FLOAT_BYTES = 4  #: a dense payload is float32 on the wire


@dataclass(frozen=True)
class Release:
    """One payload a client releases: who, when, what kind, and on what.

    Attributes:
        client: client index k.
        round: communication round (0 = set-up).
        phase: the phase it is released in (``upload``, or the phase of a query).
        kind: ``logits`` or ``probs``.
        key: identifies the inputs (their public rows, or the bytes of attacker-chosen images); a client
            answers the same inputs the same way within a phase, so repeating a query averages nothing away.
    """

    client: int
    round: int
    phase: str
    kind: PayloadKind
    key: bytes

    @staticmethod
    def key_of(inputs: Tensor) -> bytes:
        """A short digest of the rows or images a payload answers."""
        return hashlib.blake2b(inputs.detach().cpu().contiguous().numpy().tobytes(), digest_size=16).digest()

    def generator(self, seed: int, name: str) -> torch.Generator:
        """A generator seeded by (run seed, defense, round, phase, client, inputs): reproducible and resumable."""
        digest = hashlib.blake2b(repr((seed, name, self.round, self.phase, self.client)).encode() + self.key, digest_size=8).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))


class Defense(ABC):
    """A registered defense: its name, its settings dataclass and what it needs from the protocol."""

    name: ClassVar[str]
    Settings: ClassVar[type]
    needs: ClassVar[frozenset[Capability]] = frozenset()

    def __init__(self, settings: Any, seed: int) -> None:
        self.settings = settings
        self.seed = seed

    def describe(self) -> str:
        """This defense and its settings in a few words, for the run's start-up summary; its name by default."""
        return self.name

    def round_metrics(self) -> dict[str, float]:
        """Metrics after each round (set-up included), logged as ``defense/<name>/<key>``; none by default."""
        return {}

    def state_dict(self) -> dict:
        """What a checkpoint keeps of this defense between rounds (e.g. DP-SGD's privacy accountants)."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - an optional hook: most defenses keep no state
        """Restore :meth:`state_dict`."""


class UploadDefense(Defense):
    """Transforms an (N, J) payload of logits or probabilities before it leaves the client."""

    needs = frozenset({Capability.output_uploads})

    @abstractmethod
    def transform(self, payload: Tensor, release: Release) -> Tensor:
        """The defended payload, same shape and kind."""

    def encoded_bytes(self, payload: Tensor, release: Release, size: int) -> int:
        """Bytes on the wire after this defense, given ``size`` bytes before it (default: unchanged)."""
        return size


NetworkChange = Callable[[nn.Module], nn.Module]
"""A change of the architecture itself (MID's VIB head): ``network -> changed network``, a function of settings alone."""


class TrainingDefense(Defense):
    """Wraps how a client trains; each hook returns its argument unchanged unless overridden."""

    #: whether the clients' training under this defense can run as one vmapped batch (``trainer.vectorise=true``
    #: accepts it): the jobs it makes carry everything the vectorised path needs (DP-SGD's ``FitJob.private``)
    vectorised: bool = False

    def network_change(self) -> NetworkChange | None:
        """The change this defense makes to the architecture (MID's VIB head in place of the last linear layer), or None.

        The protocol applies it to every client's network and to a server model that is the clients' average
        (FedAvg), before any :meth:`wrap_network`, so that every model of the run has one architecture; the attacker's
        view carries it too (a white-box participant knows the model it inverts). It therefore holds settings only,
        never a model, data or this defense's state. It may raise :class:`ValueError` as :meth:`wrap_network` does.
        """
        return None

    def wrap_network(self, client: int, net: nn.Module) -> nn.Module:
        """The client's network (e.g. MID's information bottleneck).

        Raises:
            ValueError: this defense cannot train the network; the message reads on from ``model.name=<name>``
                (``has BatchNorm2d, which ...``) and the protocol reports it naming the key.
        """
        return net

    def wrap_objective(self, client: int, objective: Objective) -> Objective:
        """The client's loss of one phase (e.g. BiDO's HSIC terms)."""
        return objective

    def wrap_optimizer(self, client: int, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The client's optimizer, for every phase."""
        return optimizer

    def wrap_job(self, client: int, phase: str, job: FitJob, batch_size: int) -> FitJob:
        """The client's training in one phase, trained in mini-batches of ``batch_size`` (e.g. DP-SGD's Poisson
        batches and clipped, noised steps in the phases on private data, through ``job.sampler`` and ``job.session``)."""
        return job


def dense_bytes(payload: Tensor) -> int:
    """Bytes of a payload sent as float32."""
    return payload.numel() * FLOAT_BYTES


DEFENSES: Registry[type[Defense]] = Registry("defense", "defenses")
