"""The server's documented active powers (DESIGN.md's ``Adversary``), granted per attack by the threat model.

A protocol's :class:`~fdattack.fd.threat.ThreatModel` lists the powers its server has
(``adversary=...``); an attack that declares one of them in its registry entry gets an
:class:`Adversary` holding exactly the granted ones. Through it the attack can

- choose the public rows of the next round (``choose_public_batch``),
- add its own images to the next round's public batch (``add_public_samples``),
- send one client a chosen aggregate in place of the real one, this round (``send_aggregate``),
- ask a client for its outputs on chosen images while a phase is open (``query_chosen_batch``); the answer is a
  :class:`~fdattack.fd.record.Reply` that says which images the client answered (an evasive client withholds some).

The adversary holds only what the attack queued and, with the query power, a :class:`~fdattack.fd.answering.Line` to
the protocol's answering thread, open while a phase is (:mod:`fdattack.fd.answering`: the answerer, with the queried
networks, and the round's clients stay on that thread, which checks every query itself). Every use is counted; the
counts are logged per round under ``adversary/<attack>/...``.

The checks here tell an attack early what it may not do; the protocol does not rely on them. It keeps its own record
of each grant and checks what it takes from an adversary again (:func:`checked_rows`, :func:`checked_images`,
:func:`checked_aggregate`), so an attack that widens ``powers`` or writes a queue directly gains nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from fdattack.fd.answering import Line
from fdattack.fd.boundary import plain_tensor
from fdattack.fd.record import QueryRefusedError, Reply, StaleQueryError
from fdattack.fd.threat import Capability

#: ``(client, images (M, C, H, W))`` -> the outputs (M, J) as the client would send them with the images it answered,
#: and their size on the wire in bytes (the upload defenses' encoding, as the uploads count it)
ImageAnswer = Callable[[int, Tensor], tuple[Reply, int]]


def checked_rows(rows: object, num_public: int) -> Tensor:
    """Chosen public rows as a plain (N,) long tensor, each in 0..num_public - 1 (ValueError otherwise)."""
    rows = plain_tensor(rows, "chosen public rows").to(torch.long).flatten().cpu()
    if rows.numel() == 0 or int(rows.min()) < 0 or int(rows.max()) >= num_public:
        raise ValueError(f"chosen public rows must be a non-empty subset of 0..{num_public - 1}")
    return rows


def checked_images(images: object, image_shape: tuple[int, ...]) -> Tensor:
    """Attacker-made images as a plain float (M, C, H, W) CPU tensor of ``image_shape`` (ValueError otherwise)."""
    images = plain_tensor(images, "the attack's images").float().cpu()
    if images.dim() != 4 or tuple(images.shape[1:]) != tuple(image_shape):
        raise ValueError(f"images must be (M, {', '.join(map(str, image_shape))}); got {tuple(images.shape)}")
    return images


def checked_aggregate(aggregate: object) -> Tensor:
    """A chosen aggregate as a plain float CPU tensor (its shape is checked against the real one where it is sent)."""
    return plain_tensor(aggregate, "a chosen aggregate").float().cpu()


@dataclass(frozen=True)
class ImageGrant:
    """The protocol's own copy of what an adversary may query during one phase, checked on the answering thread."""

    round: int
    clients: tuple[int, ...]
    image_shape: tuple[int, ...]

    def answer(self, answer: ImageAnswer, client: object, images: object) -> tuple[Reply, int]:
        """``answer(client, images)`` once the client is one of the round's and the images plain, of the right shape."""
        if type(client) is not int or client not in self.clients:
            raise QueryRefusedError(f"no client {client!r} in round {self.round}; the round's clients are {self.clients}")
        return answer(client, checked_images(images, self.image_shape))


class Adversary:
    """The powers one attack is granted; every call is checked against them and counted.

    Args:
        powers: the granted subset of :data:`~fdattack.fd.threat.SERVER_POWERS`.
        num_public: rows of the public set (to check chosen rows).
        image_shape: (C, H, W) of the images it may add or query.
        line: the line queries on chosen images go by (None without that power).
    """

    def __init__(self, powers: frozenset[Capability], num_public: int, image_shape: tuple[int, int, int], line: Line | None = None) -> None:
        self.powers = powers
        self.num_public = num_public
        self.image_shape = tuple(image_shape)
        self._rows: Optional[Tensor] = None
        self._added: list[Tensor] = []
        self._aggregates: dict[int, Tensor] = {}
        self._line = line
        self.usage: Counter[str] = Counter()

    def _require(self, power: Capability) -> None:
        if power not in self.powers:
            raise QueryRefusedError(
                f"this attack was not granted {power.value}; it has: {', '.join(sorted(p.value for p in self.powers)) or 'nothing'}"
            )

    # ------------------------------------------------------------ the attack's side
    def choose_public_rows(self, rows: Tensor) -> None:
        """The public rows of the next round's batch, in place of the protocol's draw."""
        self._require(Capability.choose_public_batch)
        self._rows = checked_rows(rows, self.num_public)
        self.usage["chosen_rows"] += self._rows.numel()

    def add_public_samples(self, images: Tensor) -> None:
        """Images (unlabeled) appended to the next round's public batch: every client uploads its outputs on them."""
        self._require(Capability.add_public_samples)
        images = checked_images(images, self.image_shape)
        self._added.append(images)
        self.usage["added_samples"] += len(images)

    def send_aggregate(self, client: int, aggregate: Tensor) -> None:
        """What ``client`` receives in place of this round's aggregate (same shape as the real one)."""
        self._require(Capability.send_aggregate)
        self._aggregates[int(client)] = checked_aggregate(aggregate)
        self.usage["sent_aggregates"] += 1

    def query(self, client: int, images: Tensor) -> Reply:
        """``client``'s outputs on ``images`` as it would send them (upload kind and defenses), and which images it
        answered (``Reply.answered``; zeros stand for the others); open phases only. Only answered images cost bytes, as
        many as the defenses' encoding takes (LabelAvg: K labels and K weights per image)."""
        self._require(Capability.query_chosen_batch)
        if self._line is None:
            raise StaleQueryError("the adversary can query clients only while a phase is open (from on_record)")
        reply, size = self._line.ask(int(client), checked_images(images, self.image_shape))
        self.usage["queries"] += 1
        self.usage["query_samples"] += len(images)
        self.usage["query_bytes"] += size
        return reply

    # ------------------------------------------------------------ the protocol's side
    def take_public_choice(self) -> tuple[Optional[Tensor], Optional[Tensor]]:
        """The queued rows and added images for the round being drawn (both cleared)."""
        rows, added = self._rows, (torch.cat(self._added) if self._added else None)
        self._rows, self._added = None, []
        return rows, added

    def aggregate_for(self, client: int) -> Optional[Tensor]:
        """The chosen aggregate queued for ``client`` this round, or None."""
        return self._aggregates.get(int(client))

    def state_dict(self) -> dict:
        """What is queued for the next round (checkpointed with the run)."""
        return {"rows": self._rows, "added": list(self._added)}

    def load_state_dict(self, state: dict) -> None:
        self._rows, self._added = state["rows"], list(state["added"])

    def end_round(self) -> dict[str, float]:
        """This round's usage counts (then reset); unused chosen aggregates are discarded."""
        counts = {key: float(value) for key, value in sorted(self.usage.items())}
        self.usage.clear()
        self._aggregates.clear()
        return counts
