"""Runs rounds of named phases and publishes a :class:`RoundRecord` after each phase.

The orchestrator is protocol-side: it knows nothing of ground truth or scoring. After a phase it
hands each observer its own copy of the record, with a query handle of its own that it closes (on the protocol's own
end of it) once that observer has seen the record, so a query answers only during the phase it was published for.

The protocol's phases draw from the round's own global streams (:class:`~fdattack.randomness.GlobalStreams`, seeded
from the run seed and the round), and each call into an observer from streams of that call
(:func:`~fdattack.randomness.observer_streams`): an observer reads from the global generators nothing the protocol
drew, and what it draws or seeds there moves none of the protocol's draws (issue 47).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Collection, Sequence
from typing import Protocol as Interface

from fdattack.errors import UploadError
from fdattack.fd.boundary import BoundaryError, type_name
from fdattack.fd.observer import Observer
from fdattack.fd.protocols.base import Phase, Protocol, RoundContext
from fdattack.fd.record import UPLOAD_PHASE, PublicQuery, RoundRecord
from fdattack.randomness import GlobalStreams, derive_seed, observer_streams

log = logging.getLogger(__name__)


@dataclass
class RoundResult:
    """What the protocol reports of a round (phase losses, dropped uploads, defense metrics); no ground truth."""

    round: int
    metrics: dict[str, float]


class EndsRounds(Interface):
    """An observer with work at the end of each round (an attack: :meth:`fdattack.attacks.base.Attack.on_round_end`)."""

    name: str

    def on_round_end(self, round: int) -> Sequence[Any]: ...


class RoundOrchestrator:
    """Drives a protocol's phases, checks uploads, and notifies observers.

    Args:
        protocol: the simulated protocol.
        observers: attacks (and any other record observer), called after every phase.
        on_bad_upload: ``"error"`` stops at a NaN/inf upload; ``"drop"`` leaves that client out of the round.
        on_phase: called with the round and the phase name before the phase runs (progress display).
        queriers: the observers (by name) whose records carry a query handle: the attacks that declare
            ``public_outputs`` (the run's own list, made when it built them); None = every observer.
        attack_root: the root of the streams of each call into an observer (the run's ``attack_seed``, resolved:
            :func:`fdattack.assembly.attack_root`); None = the protocol's seed.
    """

    def __init__(
        self,
        protocol: Protocol,
        observers: Sequence[Observer],
        on_bad_upload: str = "error",
        on_phase: Callable[[int, str], None] | None = None,
        queriers: Collection[str] | None = None,
        attack_root: int | None = None,
    ) -> None:
        self.protocol = protocol
        self.attack_root = protocol.seed if attack_root is None else attack_root
        self.observers = list(observers)
        self.queriers = None if queriers is None else frozenset(queriers)
        self.on_bad_upload = on_bad_upload
        self.on_phase = on_phase or (lambda round, name: None)

    def run_setup(self) -> RoundResult:
        """Round 0: the protocol's set-up phases (transfer learning, warm-up)."""
        ctx = RoundContext(round=0, participants=list(range(self.protocol.num_clients)))
        self._run_phases(ctx, self.protocol.setup_phases(), self._streams(0))
        return RoundResult(round=0, metrics={**ctx.metrics, **self.protocol.defense_metrics()})

    def run_round(self, round: int) -> RoundResult:
        """One communication round: every phase, one record per phase."""
        ctx = RoundContext(round=round, participants=self.protocol.participants(round), batch=self.protocol.public_batch(round))
        self._run_phases(ctx, self.protocol.round_phases(round), self._streams(round))
        metrics = {**ctx.metrics, **self.protocol.defense_metrics(), "protocol/dropped_uploads": float(len(ctx.dropped))}
        return RoundResult(round=round, metrics=metrics)

    def end_round(self, observer: EndsRounds, round: int) -> list[Any]:
        """``observer.on_round_end(round)`` from global streams of that call, as a plain list.

        Raises:
            BoundaryError: it returned something other than a list or tuple (whose iteration would run its code).
        """
        with self.round_end_streams(observer.name, round).active():
            results = observer.on_round_end(round)
        if type(results) is not list and type(results) is not tuple:
            raise BoundaryError(f"attack {observer.name} returned a {type_name(type(results))} from on_round_end; it must return a list")
        return list(results)

    def round_end_streams(self, observer: str, round: int) -> GlobalStreams:
        """The global streams of ``observer``'s ``on_round_end`` of ``round``."""
        return observer_streams(self.attack_root, observer, round, "round_end")

    def _streams(self, round: int) -> GlobalStreams:
        """The protocol's own global streams for ``round``, seeded from the run seed and the round."""
        return GlobalStreams(derive_seed(self.protocol.seed, "round", round))

    def _run_phases(self, ctx: RoundContext, phases: list[Phase], streams: GlobalStreams) -> None:
        for phase in phases:
            self.on_phase(ctx.round, phase.name)
            had_uploads = bool(ctx.uploads)
            with streams.active():
                phase.run(ctx)
            if ctx.uploads and not had_uploads:
                self._check_uploads(ctx, phase.name)
            opener = self.protocol.open_phase(ctx, phase.name) if phase.attack_point or phase.name == UPLOAD_PHASE else None
            try:
                for observer in self.observers:
                    asks = opener is not None and (self.queriers is None or observer.name in self.queriers)
                    query, desk = opener(observer.name) if asks else (None, None)
                    try:
                        self._deliver(observer, self._snapshot(ctx, phase, query), ctx.round, phase.name)
                    finally:
                        if desk is not None:
                            desk.close()
            finally:
                self.protocol.close_phase()

    def _deliver(self, observer: Observer, record: RoundRecord, round: int, phase: str) -> None:
        """``record`` to ``observer`` with the global streams of that call: through its ``receive`` where it has one
        (:class:`~fdattack.fd.observer.Observer`'s, or an isolated attack's, which sends both to its worker), else
        ``on_record`` inside them."""
        streams = observer_streams(self.attack_root, observer.name, round, phase)
        receive = getattr(observer, "receive", None)
        if receive is None:
            with streams.active():
                observer.on_record(record)
        else:
            receive(record, streams)

    def _check_uploads(self, ctx: RoundContext, phase: str) -> None:
        """Refuse (or drop, when configured) uploads that carry NaN or inf."""
        for k in sorted(ctx.uploads):
            if ctx.uploads[k].is_finite():
                continue
            if self.on_bad_upload == "error":
                raise UploadError(
                    f"client {k} uploaded NaN/inf values in round {ctx.round} (phase {phase}); "
                    "set protocol.on_bad_upload=drop to leave such clients out of the round"
                )
            log.warning("round %d: dropped the NaN/inf upload of client %d", ctx.round, k)
            del ctx.uploads[k]
            ctx.dropped.append(k)
        if not ctx.uploads:
            raise UploadError(f"every client's upload in round {ctx.round} (phase {phase}) held NaN/inf values; nothing to aggregate")

    def _snapshot(self, ctx: RoundContext, phase: Phase, query: PublicQuery | None) -> RoundRecord:
        """Freeze what crossed the wire so far, for one observer: its own copies of every tensor (what it writes into
        them reaches no other observer and not the protocol), and the phase's query handle."""
        return RoundRecord(
            round=ctx.round,
            phase=phase.name,
            protocol=self.protocol.name,
            participants=tuple(ctx.participants),
            dropped=tuple(ctx.dropped),
            batch=None if ctx.batch is None else ctx.batch.clone(),
            uploads=MappingProxyType(
                {k: u.frozen_copy() for k, u in ctx.uploads.items()} if self.protocol.threat_model.sees_uploads else {}
            ),
            aggregate=None if ctx.aggregate is None else ctx.aggregate.detach().clone(),
            aggregate_kind=ctx.aggregate_kind,
            global_state=None if ctx.global_state is None else MappingProxyType({k: v.clone() for k, v in ctx.global_state.items()}),
            server_outputs=None if ctx.server_outputs is None else ctx.server_outputs.detach().clone(),
            attack_point=phase.attack_point,
            query=query,
        )
