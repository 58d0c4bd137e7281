"""From client outputs to what crosses the wire: the upload pipeline and the query answerer, on the protocol side.

A client's outputs on public samples become its payload here (:func:`as_sent`: logits or tempered probabilities, then
every upload defense in order), with an evasive client's withheld rows left out (:func:`as_answered`). The same path
makes the round's uploads (:func:`client_uploads`) and answers the attacker's queries (:class:`QueryAnswerer`), so a
query bypasses no defense and no evasion.

Everything here runs protocol-side. An answerer holds live networks, the upload defenses and the evasive clients'
digests; it lives in a protocol-side answering thread of :mod:`fdattack.fd.answering` (the attack's
:class:`~fdattack.fd.record.PublicQuery` or :class:`~fdattack.fd.adversary.Adversary` holds only a line to it), and what
an attack hands it (rows, images) becomes
a plain copy first (:mod:`fdattack.fd.boundary`). The public images' digests (:class:`PublicDigests`) stay with the
protocol too.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
from torch import Tensor

from fdattack.defenses.base import Release, UploadDefense, dense_bytes
from fdattack.engine import predict_logits
from fdattack.fd.adversary import checked_images
from fdattack.fd.boundary import plain_tensor
from fdattack.fd.evasion import Evasion, image_digests
from fdattack.fd.record import PublicBatch, QueryRefusedError, Reply, Upload, checked_model
from fdattack.vocabulary import PayloadKind


def batch_key(batch: PublicBatch) -> bytes:
    """What a payload on ``batch`` answers, for :class:`~fdattack.defenses.base.Release`."""
    key = Release.key_of(batch.rows)
    return key if batch.added is None else key + Release.key_of(batch.added)


def as_answered(
    logits: Tensor, answered: Tensor | None, temperature: float, defenses: Sequence[UploadDefense], release: Release
) -> tuple[Tensor, int]:
    """:func:`as_sent` of the rows ``answered`` (all where None); withheld rows are zeros and cost nothing on the wire."""
    if answered is None or bool(answered.all()):
        return as_sent(logits, temperature, defenses, release)
    sent, size = as_sent(logits[answered], temperature, defenses, release)
    out = sent.new_zeros(len(logits), *sent.shape[1:])
    out[answered] = sent
    return out, size


def as_sent(logits: Tensor, temperature: float, defenses: Sequence[UploadDefense], release: Release) -> tuple[Tensor, int]:
    """(N, J) logits turned into the payload a client releases, and its size on the wire in bytes.

    The payload is the logits, or their softmax at ``temperature`` for ``probs``, then each upload defense in order.
    """
    out = logits if release.kind == "logits" else torch.softmax(logits / temperature, dim=-1)
    size = dense_bytes(out)
    for defense in defenses:
        out = defense.transform(out, release)
        size = defense.encoded_bytes(out, release, size)
    return out, size


class PublicDigests:
    """The public images' digests (:func:`~fdattack.fd.evasion.image_digests`), computed on first use, and a public
    batch in the parts an evasive client reads (:meth:`~fdattack.fd.evasion.Evasion.withheld_parts`)."""

    def __init__(self, public_images: Tensor) -> None:
        self._images = public_images
        self._digests: list[bytes] | None = None

    def of_batch(self, batch: PublicBatch) -> list[list[bytes]]:
        """The two parts of ``batch``: its public rows' digests, then its added images' (where it has any)."""
        if self._digests is None:
            self._digests = image_digests(self._images)
        rows = [self._digests[i] for i in batch.rows.tolist()]
        return [rows, image_digests(batch.added)] if batch.added is not None else [rows]


class Sent(NamedTuple):
    """One client's upload, its size on the wire in bytes, and how many rows it withheld."""

    upload: Upload
    size: int
    withheld: int


def client_uploads(
    logits: Tensor,
    clients: Sequence[int],
    batch: PublicBatch,
    round: int,
    kind: PayloadKind,
    temperature: float,
    defenses: Sequence[UploadDefense],
    evasion: Evasion | None,
    digests: PublicDigests,
) -> list[Sent]:
    """Each client's upload on ``batch`` from its (N, J) logits ``logits[i]`` (``clients[i]``), in client order, through
    ``defenses``; an evasive client (:mod:`fdattack.fd.evasion`) withholds rows, and its upload says which it answered."""
    key = batch_key(batch)
    parts = digests.of_batch(batch) if evasion is not None else []
    sent = []
    for row, k in enumerate(clients):
        release = Release(k, round, "upload", kind, key)
        answered = None if evasion is None else ~evasion.withheld_parts(k, parts)
        out, size = as_answered(logits[row], answered, temperature, defenses, release)
        withheld = 0
        if answered is not None and not bool(answered.all()):
            withheld = int((~answered).sum())
        else:
            answered = None
        sent.append(Sent(Upload(client=k, kind=kind, batch=batch, outputs=out, temperature=temperature, answered=answered), size, withheld))
    return sent


class QueryAnswerer:
    """Answers queries from the queried networks alone, as the clients would send their outputs (evasive ones
    withholding as in their uploads: the answerer holds digests of their private images, no image)."""

    def __init__(
        self,
        clients: dict[int, torch.nn.Module],
        server: torch.nn.Module | None,
        public_images: Tensor,
        defenses: Sequence[UploadDefense],
        kind: PayloadKind,
        temperature: float,
        round: int,
        phase: str,
        device: torch.device,
        batch_size: int,
        evasion: Evasion | None = None,
    ) -> None:
        self.clients = clients
        self.server = server
        self.public_images = public_images
        self.defenses = tuple(defenses)
        self.kind = kind
        self.temperature = temperature
        self.round = round
        self.phase = phase
        self.device = device
        self.batch_size = batch_size
        self.evasion = evasion

    def __call__(self, model: int | str, rows: Tensor) -> Tensor:
        """Outputs on public ``rows``: the server's logits, or a client's payload (refused where it withholds a row)."""
        model = checked_model(model)
        rows = plain_tensor(rows, "queried public rows").to(torch.long).cpu()
        images = self.public_images[rows]
        if model == "server":
            assert self.server is not None
            return predict_logits(self.server, images, self.device, self.batch_size)
        reply, _ = self._client_payload(int(model), images, Release.key_of(rows))
        if not reply.complete:
            raise QueryRefusedError(
                f"client {model} withholds {int((~reply.answered).sum())} of these public rows (protocol.evasive_clients)"
            )
        return reply.outputs

    def on_images(self, client: int, images: Tensor) -> tuple[Reply, int]:
        """A client's payload on attacker-chosen images (:meth:`Adversary.query`), with the images it answered, and its size
        on the wire in bytes."""
        images = checked_images(images, tuple(self.public_images.shape[1:]))
        return self._client_payload(checked_model(client), images, b"images" + Release.key_of(images))

    def _client_payload(self, client: int, images: Tensor, key: bytes) -> tuple[Reply, int]:
        if self.evasion is not None:
            withheld = self.evasion.withheld(client, image_digests(images))
        else:
            withheld = torch.zeros(len(images), dtype=torch.bool)
        logits = predict_logits(self.clients[client], images, self.device, self.batch_size)
        release = Release(client, self.round, self.phase, self.kind, key)
        outputs, size = as_answered(logits, ~withheld, self.temperature, self.defenses, release)
        return Reply(outputs, ~withheld), size
