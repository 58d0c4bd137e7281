"""Evasive clients (Shi et al., PoPETs 2025, §5.5): a cautious client refuses to return outputs for samples of its
own training set.

This is a client behaviour on the protocol side (``protocol.evasive_clients``), not an attack. A client recognises
its samples by exact equality with its private images (compared through digests of their bytes, so the answerer
holds no private image). From every request (an upload on the round's public batch, a server query) it withholds
each sample it holds and ``decoys`` (``protocol.evasion_decoys``, default 1, the paper leaves it open) decoys per
such sample: the other samples of the request with the smallest keys, a key being a seeded digest of the client and
the image. A sample's key does not depend on the request, so asking again, or in another order, withholds the same
samples.

Decoys do not hide the members from a server that knows this rule: every member is withheld and an answered row is
never one, so a withheld row is a member with odds 1 : ``decoys`` (Co-op LiRA scores it as a predicted member,
:mod:`fdattack.attacks.lira`). Only a rate that withholds every row of the request (``decoys=inf``) leaves the
withheld mask without membership information.

A public batch is two requests here: its public rows and the images the server added (the message tells them
apart). Decoys come from the part that holds the members; drawn from the whole batch, they would be public rows
nearly always, and the server would see that every withheld added image is a member.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Mapping, Sequence

import torch
from omegaconf import ListConfig
from torch import Tensor

from fdattack.errors import ConfigError

#: the values ``protocol.evasive_clients`` takes, in words
EVASIVE_VALUES = "none, all, or a list of distinct client indices"


def evasive_clients(value: Any, num_clients: int, uploads_outputs: bool = True, key: str = "protocol.evasive_clients") -> frozenset[int]:
    """The clients that ``value`` (``none``, ``all`` or a list of client indices) makes evasive.

    Raises:
        ConfigError: ``protocol.evasive_clients=[5]: ...; allowed: none, all, or a list of distinct client indices in 0..3``
    """
    allowed = f"allowed: {EVASIVE_VALUES} in 0..{num_clients - 1}"
    if value == "none":
        return frozenset()
    if value == "all":
        chosen = frozenset(range(num_clients))
    elif isinstance(value, (list, tuple, ListConfig)):
        items = list(value)
        if not all(isinstance(k, int) and not isinstance(k, bool) and 0 <= k < num_clients for k in items) or len(set(items)) != len(items):
            raise ConfigError(f"{key}={items!r} names a client twice or one that does not exist; {allowed}")
        chosen = frozenset(items)
    else:
        raise ConfigError(f"{key}={value!r} is not known; {allowed}")
    if chosen and not uploads_outputs:
        raise ConfigError(
            f"{key}={value!r}: this protocol's clients upload weights, not outputs on samples they could withhold; use {key}=none"
        )
    return chosen


def image_digests(images: Tensor) -> list[bytes]:
    """One digest per image (N, C, H, W) of its float32 bytes (-0.0 read as 0.0): equal images, equal digests."""
    flat = (images.detach().float().cpu() + 0.0).contiguous().flatten(1).numpy()
    return [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in flat]


class Evasion:
    """What the evasive clients withhold.

    Args:
        private: client -> (N_k, C, H, W) its private images, for every evasive client (only digests are kept).
        seed: seeds the decoys' keys (derive it from the run seed).
        decoys: decoys withheld per withheld own sample of a request, >= 0, rounded half up to whole samples; inf (or
            any rate the request's other samples cannot fill) withholds the whole request.
    """

    def __init__(self, private: Mapping[int, Tensor], seed: int, decoys: float = 1.0) -> None:
        if not decoys >= 0:
            raise ValueError(f"decoys must be >= 0 (inf: the whole request), got {decoys}")
        self._held = {k: frozenset(image_digests(images)) for k, images in private.items()}
        self._salt = {k: seed.to_bytes(8, "little") + k.to_bytes(4, "little") for k in private}
        self.decoys = decoys

    @property
    def clients(self) -> frozenset[int]:
        return frozenset(self._held)

    def withheld(self, client: int, digests: Sequence[bytes]) -> Tensor:
        """(N,) bool: the samples of one request (by :func:`image_digests`) that ``client`` withholds, its own and
        ``decoys`` decoys per own sample (all the others where they are fewer)."""
        if client not in self._held:
            return torch.zeros(len(digests), dtype=torch.bool)
        held = self._held[client]
        member = torch.tensor([d in held for d in digests], dtype=torch.bool)
        count = int(member.sum())
        if count == 0:
            return member
        others = torch.nonzero(~member).flatten()
        wanted = self.decoys * count
        take = len(others) if wanted >= len(others) else math.floor(wanted + 0.5)
        salt = self._salt[client]
        keys = torch.tensor(
            [int.from_bytes(hashlib.blake2b(salt + digests[i], digest_size=7).digest(), "little") for i in others.tolist()],
            dtype=torch.long,
        )
        decoys = others[torch.argsort(keys)[:take]]
        return member.index_fill(0, decoys, True)

    def withheld_parts(self, client: int, parts: Sequence[Sequence[bytes]]) -> Tensor:
        """:meth:`withheld` of each part of a request (a batch's public rows, then its added images), concatenated."""
        return torch.cat([self.withheld(client, part) for part in parts]) if parts else torch.zeros(0, dtype=torch.bool)
