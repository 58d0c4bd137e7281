"""What crosses the wire in a round, as published to observers after every phase.

A :class:`RoundRecord` holds only what the protocol's messages carry (each client's upload exactly
as sent, the aggregate sent back, the server model's outputs on public samples) plus a
:class:`PublicQuery` handle that answers model queries on *public* samples only. It never holds a
private image, a private label or a reference to the data module: ``tests/test_record.py`` checks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Literal, Mapping

import torch
from torch import Tensor

PayloadKind = Literal["logits", "probs", "weights"]


@dataclass(frozen=True)
class Upload:
    """One client's message to the server.

    Attributes:
        client: client index k.
        kind: ``"logits"`` (raw), ``"probs"`` (softmax at ``temperature``) or ``"weights"`` (FedAvg).
        public_indices: (N,) rows of the public set the outputs refer to (None for weights).
        outputs: (N, J) logits or probabilities, or None for weights.
        state: model weights (FedAvg), or None.
        num_samples: n_k, the client's private-set size (FedAvg weighting).
        temperature: softmax temperature of ``probs`` uploads.
    """

    client: int
    kind: PayloadKind
    public_indices: Tensor | None = None
    outputs: Tensor | None = None
    state: Mapping[str, Tensor] | None = None
    num_samples: int = 0
    temperature: float = 1.0

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
            public_indices=None if self.public_indices is None else self.public_indices.clone(),
            outputs=None if self.outputs is None else self.outputs.detach().clone(),
            state=state,
            num_samples=self.num_samples,
            temperature=self.temperature,
        )


class PublicQuery:
    """Black-box access to the round's models on public samples only.

    PLI's threat model (pli.md §2, §13.9) lets the server obtain every client's outputs on any
    public sample; this handle grants exactly that and nothing else.

    Args:
        answer: ``(model, public_indices) -> (N, J) logits``; ``model`` is a client index or ``"server"``.
        num_public: size of the public set (indices are checked against it).
        clients: the client indices that can be queried.
        has_server: whether a server model exists.
    """

    def __init__(self, answer: Callable[[int | str, Tensor], Tensor], num_public: int, clients: tuple[int, ...], has_server: bool) -> None:
        self._answer = answer
        self.num_public = num_public
        self.clients = clients
        self.has_server = has_server

    def __call__(self, model: int | str, public_indices: Tensor) -> Tensor:
        idx = torch.as_tensor(public_indices, dtype=torch.long)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.num_public):
            raise IndexError(f"public indices must lie in [0, {self.num_public})")
        if model == "server" and not self.has_server:
            raise KeyError("this protocol has no server model")
        if model != "server" and model not in self.clients:
            raise KeyError(f"no client {model!r}; clients are {self.clients}")
        return self._answer(model, idx)


@dataclass(frozen=True)
class RoundRecord:
    """Published after each phase of a round.

    Attributes:
        round: round index t (0 = the set-up phases before round 1).
        phase: the phase just finished (``local_train``, ``upload``, ``aggregate``, ``server_train``, ``distill``...).
        protocol: protocol name.
        participants: clients taking part in this round.
        dropped: clients whose upload was refused this round (NaN/inf with ``on_bad_upload=drop``).
        public_indices: (N,) public rows used this round (None = none).
        uploads: client -> :class:`Upload`, as sent (empty before the upload phase).
        aggregate: what the server sent back: (N, J) consensus/ERA/robust mean, or None.
        aggregate_kind: ``"logits"``, ``"probs"`` or ``"weights"``.
        global_state: FedAvg's aggregated weights, or None.
        server_outputs: (N, J) server-model logits on ``public_indices`` where a server model exists.
        attack_point: True on the phase after which the protocol's passive attacks run (pli.md §5).
        query: black-box :class:`PublicQuery` on public samples.
    """

    round: int
    phase: str
    protocol: str
    participants: tuple[int, ...]
    dropped: tuple[int, ...] = ()
    public_indices: Tensor | None = None
    uploads: Mapping[int, Upload] = field(default_factory=lambda: MappingProxyType({}))
    aggregate: Tensor | None = None
    aggregate_kind: str | None = None
    global_state: Mapping[str, Tensor] | None = None
    server_outputs: Tensor | None = None
    attack_point: bool = False
    query: PublicQuery | None = None
