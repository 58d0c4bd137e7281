"""What crosses the wire in a round, as published to observers after every phase.

A :class:`RoundRecord` holds only what the protocol's messages carry (each client's upload exactly
as sent, with the rows it answered, the aggregate sent back, the server model's outputs on public samples) plus a
:class:`PublicQuery` handle that answers model queries on the public rows the threat model grants,
during the record's own phase only. It never holds a private image, a private label or a reference
to the data module, and once its phase is over nothing in it reaches a model:
``tests/test_record.py`` and ``tests/test_threat_model.py`` check it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np
import torch
from torch import Tensor

from fdattack.data.imageset import UNLABELED
from fdattack.fd.answering import Desk, Line, Refusal
from fdattack.fd.boundary import plain_tensor
from fdattack.vocabulary import PayloadKind

#: the phase after which the round's uploads have crossed the wire; with the attack point, the only phase whose record
#: opens queries (after the others a query would read model states that never cross the wire)
UPLOAD_PHASE = "upload"


@dataclass(frozen=True)
class PublicBatch:
    """The public samples of one round: rows of the public set, then any images the server added.

    Attributes:
        rows: (N,) public rows, in the order the clients answer them.
        added: (M, C, H, W) attacker-made images appended after the rows (unlabeled), or None.
    """

    rows: Tensor
    added: Tensor | None = None

    def __len__(self) -> int:
        return len(self.rows) + self.num_added

    @property
    def num_added(self) -> int:
        return 0 if self.added is None else len(self.added)

    def labels_in(self, public_labels: Tensor) -> Tensor:
        """(N + M,) the labels of the rows in ``public_labels`` (the public set's, as known), then UNLABELED for the added images."""
        return torch.cat([public_labels[self.rows], torch.full((self.num_added,), UNLABELED, dtype=public_labels.dtype)])

    def clone(self) -> "PublicBatch":
        return PublicBatch(self.rows.clone(), None if self.added is None else self.added.clone())


@dataclass(frozen=True)
class Reply:
    """A client's answer to a request for outputs on some samples, where it may withhold some (an evasive client).

    Attributes:
        outputs: (N, J) the outputs on the samples answered; the rows of withheld samples are zeros, no answer.
        answered: (N,) bool, which samples it answered. The requester learns which rows were withheld, never why.
    """

    outputs: Tensor
    answered: Tensor

    @property
    def complete(self) -> bool:
        return bool(self.answered.all())


@dataclass(frozen=True)
class Upload:
    """One client's message to the server.

    Attributes:
        client: client index k.
        kind: ``"logits"`` (raw), ``"probs"`` (softmax at ``temperature``) or ``"weights"`` (FedAvg).
        batch: the round's public samples the outputs refer to (None for weights).
        outputs: (N + M, J) logits or probabilities on ``batch`` (its rows, then its added images), or None for weights;
            zeros on the rows it withheld (see ``answered``).
        state: model weights (FedAvg), or None.
        num_samples: n_k, the client's private-set size (FedAvg weighting).
        temperature: softmax temperature of ``probs`` uploads.
        answered: (N + M,) bool, the rows of ``batch`` it answered, where an evasive client withheld some
            (``protocol.evasive_clients``); None = every row.
    """

    client: int
    kind: PayloadKind
    batch: PublicBatch | None = None
    outputs: Tensor | None = None
    state: Mapping[str, Tensor] | None = None
    num_samples: int = 0
    temperature: float = 1.0
    answered: Tensor | None = None

    def reply(self) -> Reply:
        """The outputs with the rows answered (all of them where :attr:`answered` is None)."""
        assert self.outputs is not None
        answered = torch.ones(len(self.outputs), dtype=torch.bool) if self.answered is None else self.answered
        return Reply(self.outputs, answered)

    def tensors(self) -> list[Tensor]:
        """Every tensor the upload carries (for NaN checks)."""
        found = [t for t in (self.outputs,) if t is not None]
        if self.state is not None:
            found += [v for v in self.state.values() if torch.is_tensor(v)]
        return found

    def is_finite(self) -> bool:
        return all(bool(torch.isfinite(t).all()) for t in self.tensors() if t.is_floating_point())

    def frozen_copy(self) -> "Upload":
        """A copy whose tensors observers may keep without aliasing protocol state."""
        state = None if self.state is None else MappingProxyType({k: v.detach().clone() for k, v in self.state.items()})
        return Upload(
            client=self.client,
            kind=self.kind,
            batch=None if self.batch is None else self.batch.clone(),
            outputs=None if self.outputs is None else self.outputs.detach().clone(),
            state=state,
            num_samples=self.num_samples,
            temperature=self.temperature,
            answered=None if self.answered is None else self.answered.clone(),
        )


class StaleQueryError(RuntimeError):
    """A query handle was used after the phase it was published for."""


class QueryRefusedError(PermissionError):
    """A query asked for a model or public rows its threat model does not grant."""


#: ``(model, public_indices) -> (N, J) outputs``; ``model`` is a client index or ``"server"``
Answer = Callable[[int | str, Tensor], Tensor]


def checked_model(model: object) -> int | str:
    """A queried model as a plain ``int`` client index or the string ``"server"``. Checked by exact type: an attack's
    object, whose ``__eq__`` or ``__index__`` would run its code inside the protocol, is refused."""
    if type(model) is str and model == "server":
        return "server"
    if type(model) is int or type(model) in _NUMPY_INTEGERS:
        return int(model)  # type: ignore[call-overload]
    raise QueryRefusedError(f"a queried model must be a client index (an int) or 'server', not a {type(model).__qualname__}")


_NUMPY_INTEGERS = frozenset({np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64})


class PublicQuery:
    """Black-box access to the models on public samples, for one attack during one phase of one round.

    The handle answers only while its phase is open for its attack (during that attack's ``on_record``): the protocol
    closes it then, and a later call raises :class:`StaleQueryError` naming the phase. So an attack gets the clients'
    outputs *at its attack point* (PLI's: after the round's local training, as in the PLI authors' code) and must
    collect them when the record arrives. The handle holds only a :class:`~fdattack.fd.answering.Line` to a protocol-side
    thread, which holds the answerer and its own copy of the grant and checks every call against it (attributes
    written on the handle change nothing).

    Client answers are what the client would upload on those rows (``kind``, ``temperature``), through
    the same upload transforms, so querying bypasses no defense; ``"server"`` answers are the
    attacker's own server model's logits.

    Attributes:
        round: round index of the record.
        phase: the phase the record was published after.
        rows: (M,) the public rows the threat model grants (sorted).
        clients: the client indices that can be queried (the round's participants).
        has_server: whether a server model exists.
        kind: ``"logits"`` or ``"probs"``: what client answers are, as the uploads.
        temperature: softmax temperature of ``probs`` answers.
    """

    def __init__(
        self,
        line: Line,
        round: int,
        phase: str,
        rows: Tensor,
        clients: tuple[int, ...],
        has_server: bool,
        kind: PayloadKind = "logits",
        temperature: float = 1.0,
    ) -> None:
        self._line = line
        self.round = round
        self.phase = phase
        self.rows = rows.clone()
        self.clients = clients
        self.has_server = has_server
        self.kind = kind
        self.temperature = temperature

    def __call__(self, model: int | str, public_indices: Tensor) -> Tensor:
        return self._line.ask(model, public_indices)


@dataclass(frozen=True)
class RowGrant:
    """The protocol's own copy of what one attack's query may ask, checked on the answering thread."""

    attack: str
    round: int
    phase: str
    rows: Tensor  # (P,) bool: which public rows are granted
    clients: tuple[int, ...]
    has_server: bool

    def answer(self, answer: Answer, model: object, public_indices: object) -> Tensor:
        """``answer(model, rows)`` once the model is one of the grant's and every row a granted one."""
        model = checked_model(model)
        idx = plain_tensor(public_indices, "queried public rows").to(torch.long).flatten().cpu()
        if model == "server" and not self.has_server:
            raise QueryRefusedError("this protocol has no server model")
        if model != "server" and model not in self.clients:
            raise QueryRefusedError(f"no client {model!r} in round {self.round}; the round's clients are {self.clients}")
        outside = (idx < 0) | (idx >= len(self.rows))
        if bool(outside.any()) or not bool(self.rows[idx[~outside]].all()):
            raise QueryRefusedError(
                f"attack {self.attack} asked round {self.round}, phase {self.phase!r} for public rows outside the "
                f"{int(self.rows.sum())} rows its threat model grants (query.rows)"
            )
        return answer(model, idx)


def open_query(
    answer: Answer,
    attack: str,
    round: int,
    phase: str,
    rows: Tensor,
    clients: tuple[int, ...],
    has_server: bool,
    kind: PayloadKind = "logits",
    temperature: float = 1.0,
) -> tuple[PublicQuery, Desk]:
    """A :class:`PublicQuery` for ``attack``, answered by ``answer`` on a thread of its own until the protocol closes the
    returned :class:`~fdattack.fd.answering.Desk` (the protocol's end; the attack never holds it)."""
    granted = torch.zeros(int(rows.max()) + 1 if rows.numel() else 0, dtype=torch.bool)
    granted[rows] = True
    grant = RowGrant(attack, round, phase, granted, tuple(clients), has_server)
    desk = Desk(
        Refusal(
            StaleQueryError,
            f"the query handle of round {round}, phase {phase!r} was used after that phase ended; "
            "collect the outputs in on_record, when the record arrives",
            final=True,
        )
    )
    desk.open(functools.partial(grant.answer, answer))
    return PublicQuery(desk.line, round, phase, rows, tuple(clients), has_server, kind, temperature), desk


@dataclass(frozen=True)
class RoundRecord:
    """Published after each phase of a round.

    Attributes:
        round: round index t (0 = the set-up phases before round 1).
        phase: the phase just finished (``local_train``, ``upload``, ``aggregate``, ``server_train``, ``distill``...).
        protocol: protocol name.
        participants: clients taking part in this round.
        dropped: clients whose upload was refused this round (NaN/inf with ``on_bad_upload=drop``).
        batch: the round's public samples (None = none).
        uploads: client -> :class:`Upload`, as sent (empty before the upload phase).
        aggregate: what the server sent back: (N, J) consensus/ERA/robust mean, or None.
        aggregate_kind: ``"logits"``, ``"probs"`` or ``"weights"``.
        global_state: FedAvg's aggregated weights, or None.
        server_outputs: (N + M, J) server-model logits on ``batch`` where a server model exists.
        attack_point: True on the phase after which the protocol's passive attacks run (PLI's, Takahashi et al., CVPR 2023, Algorithm 1).
        query: black-box :class:`PublicQuery` on public samples, open during this phase only (None without public data).
    """

    round: int
    phase: str
    protocol: str
    participants: tuple[int, ...]
    dropped: tuple[int, ...] = ()
    batch: PublicBatch | None = None
    uploads: Mapping[int, Upload] = field(default_factory=lambda: MappingProxyType({}))
    aggregate: Tensor | None = None
    aggregate_kind: str | None = None
    global_state: Mapping[str, Tensor] | None = None
    server_outputs: Tensor | None = None
    attack_point: bool = False
    query: PublicQuery | None = None
