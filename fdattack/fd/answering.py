"""Where a phase's query answerer waits while the phase is open: protocol-side, behind an opaque token.

An answerer holds the live networks a query reaches, the upload defenses with their settings and the evasive
clients' digests of their private images. A query handle (:class:`~fdattack.fd.record.PublicQuery`) or an
:class:`~fdattack.fd.adversary.Adversary` holds only the token of its phase's answerer, never the answerer, so no
object an attack holds leads to a network; closing the phase drops the answerer, after which the token answers nothing.
"""

from __future__ import annotations

import secrets
from typing import Any

#: the open answerers, by token
_OPEN: dict[int, Any] = {}


def register(answerer: Any) -> int:
    """Keep ``answerer`` until :func:`release`; returns its token (random, 64 bits)."""
    token = secrets.randbits(64)
    while token in _OPEN:
        token = secrets.randbits(64)
    _OPEN[token] = answerer
    return token


def lookup(token: int | None) -> Any | None:
    """The answerer of ``token``, or None once it is released (or for None)."""
    return None if token is None else _OPEN.get(token)


def release(token: int | None) -> None:
    """Drop the answerer of ``token`` (nothing if it is gone already)."""
    if token is not None:
        _OPEN.pop(token, None)
