"""What travels between the run and an attack's worker: the worker's brief, records as plain data, and the messages.

The run sends the worker pickles (the worker trusts the run); the worker sends the run :mod:`~fdattack.isolation.codec`
messages (the run trusts nothing the worker sends):

==========================  =================================================================================
run -> worker               worker -> run
==========================  =================================================================================
``DeclarationBrief`` (only)  ``("declared", {attack: Declaration.to_names()})``, then exits
``WorkerBrief`` (first)     ``("ready", abi)``
``("record", seed, dict)``  any number of ``("ask", what, args)``, each answered; then ``("done",)``
``("round_end", seed, r)``  asks, then ``("results", [(type name, fields), ...])``
``("state",)``              ``("state", bytes)``
``("load", state)``         ``("done",)``
``("answer", value)``       (the answer to the worker's last ask)
``("refused", kind, msg)``  (its refusal: the exception's type name and message)
``("stop",)``               (exits)
==========================  =================================================================================

and ``("failed", one line)`` in place of any reply when the attack raised (the worker exits after it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Optional

from fdattack.fd.boundary import BoundaryError
from fdattack.fd.record import PublicQuery, QueryRefusedError, RoundRecord, StaleQueryError, Upload
from fdattack.fd.threat import AttackerView, Capability


@dataclass(frozen=True)
class QueryShape:
    """What a record's query handle says of itself (its answers come over the channel)."""

    round: int
    phase: str
    rows: Any  # (M,) long tensor
    clients: tuple[int, ...]
    has_server: bool
    kind: str
    temperature: float


@dataclass(frozen=True)
class AdversaryShape:
    """What an attack's adversary says of itself (its actions go over the channel)."""

    powers: frozenset[Capability]
    num_public: int
    image_shape: tuple[int, int, int]


@dataclass(frozen=True)
class WorkerBrief:
    """Everything a worker is built from: the attack's own view, settings and seed, never the run's.

    Attributes:
        attack: the attack's registry name.
        plugins: modules to import before the registry is read (the run's ``plugins``).
        settings: the attack's settings as a plain dict (``attack.<name>``; the worker makes its ``Settings``).
        view: the attack's own :class:`~fdattack.fd.threat.AttackerView` (only the parts it reads).
        seed: the attacker's seed (never the run seed).
        globals_seed: the worker's global generators' seed before its first call.
        state_root: the attacks' state folder; the worker keeps its own under ``<state_root>/<attack>``.
        keep: how many checkpoints' rounds its store keeps (``keep_checkpoints``).
        threads: torch's intra-op threads (the run's).
        trainer: ``accelerator``, ``devices``, ``precision``, ``vectorise`` and ``batch_size`` of its engine.
        adversary: its granted powers, or None.
        cache: the attack's own folder of cached networks (``<cache_dir>/attacks/<attack>``), or None.
    """

    attack: str
    plugins: tuple[str, ...]
    settings: dict[str, Any]
    view: AttackerView
    seed: int
    globals_seed: int
    state_root: str
    keep: int
    threads: int
    trainer: dict[str, Any]
    adversary: Optional[AdversaryShape]
    cache: Optional[str] = None


@dataclass(frozen=True)
class DeclarationBrief:
    """What a declaring worker reads the attacks' declarations with: the run's ``plugins`` and each attack's settings as a
    plain dict (:func:`fdattack.attacks.declaration.declare`)."""

    plugins: tuple[str, ...]
    settings: dict[str, dict[str, Any]]


def record_to_wire(record: RoundRecord) -> tuple[dict[str, Any], Optional[QueryShape]]:
    """A record as plain data (mappings as dicts, uploads as field dicts) and its query's shape, without the handle."""
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name != "query"}
    fields["uploads"] = {
        k: {**{f.name: getattr(u, f.name) for f in dataclasses.fields(u)}, "state": _dict(u.state)} for k, u in record.uploads.items()
    }
    fields["global_state"] = _dict(record.global_state)
    q = record.query
    shape = None if q is None else QueryShape(q.round, q.phase, q.rows.clone(), tuple(q.clients), q.has_server, q.kind, q.temperature)
    return fields, shape


def record_from_wire(fields: dict[str, Any], query: Optional[PublicQuery]) -> RoundRecord:
    """The worker's record: :func:`record_to_wire` undone, with ``query`` (answered over the channel)."""
    uploads = {k: Upload(**{**u, "state": _proxy(u["state"])}) for k, u in fields["uploads"].items()}
    return RoundRecord(**{**fields, "uploads": MappingProxyType(uploads), "global_state": _proxy(fields["global_state"]), "query": query})


def _dict(mapping: Any) -> Optional[dict]:
    return None if mapping is None else dict(mapping)


def _proxy(mapping: Optional[dict]) -> Any:
    return None if mapping is None else MappingProxyType(mapping)


#: the exceptions a refusal may name, raised again on the worker's side by name (anything else: RuntimeError)
REFUSALS: dict[str, type[Exception]] = {
    kind.__name__: kind for kind in (StaleQueryError, QueryRefusedError, BoundaryError, ValueError, TypeError, PermissionError, KeyError)
}
