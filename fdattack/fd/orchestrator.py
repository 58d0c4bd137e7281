"""Runs rounds of named phases and publishes a :class:`RoundRecord` after each phase.

The orchestrator is protocol-side: it knows nothing of ground truth or scoring. After a phase it
hands the record to every observer, then closes the record's query handle, so a query answers only
during the phase it was published for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Sequence

import torch

from fdattack.errors import UploadError
from fdattack.fd.observer import Observer
from fdattack.fd.protocols.base import Phase, Protocol, RoundContext
from fdattack.fd.record import UPLOAD_PHASE, RoundRecord
from fdattack.randomness import derive_seed

log = logging.getLogger(__name__)


@dataclass
class RoundResult:
    """What the protocol reports of a round (phase losses, dropped uploads, defense metrics); no ground truth."""

    round: int
    metrics: dict[str, float]


class RoundOrchestrator:
    """Drives a protocol's phases, checks uploads, and notifies observers.

    Args:
        protocol: the simulated protocol.
        observers: attacks (and any other record observer), called after every phase.
        on_bad_upload: ``"error"`` stops at a NaN/inf upload; ``"drop"`` leaves that client out of the round.
        on_phase: called with the round and the phase name before the phase runs (progress display).
    """

    def __init__(
        self,
        protocol: Protocol,
        observers: Sequence[Observer],
        on_bad_upload: str = "error",
        on_phase: Callable[[int, str], None] | None = None,
    ) -> None:
        self.protocol = protocol
        self.observers = list(observers)
        self.on_bad_upload = on_bad_upload
        self.on_phase = on_phase or (lambda round, name: None)

    def run_setup(self) -> RoundResult:
        """Round 0: the protocol's set-up phases (transfer learning, warm-up)."""
        ctx = RoundContext(round=0, participants=list(range(self.protocol.num_clients)))
        self._run_phases(ctx, self.protocol.setup_phases())
        return RoundResult(round=0, metrics={**ctx.metrics, **self.protocol.defense_metrics()})

    def run_round(self, round: int) -> RoundResult:
        """One communication round: every phase, one record per phase."""
        torch.manual_seed(derive_seed(self.protocol.seed, "round", round))
        ctx = RoundContext(round=round, participants=self.protocol.participants(round), batch=self.protocol.public_batch(round))
        self._run_phases(ctx, self.protocol.round_phases(round))
        metrics = {**ctx.metrics, **self.protocol.defense_metrics(), "protocol/dropped_uploads": float(len(ctx.dropped))}
        return RoundResult(round=round, metrics=metrics)

    def _run_phases(self, ctx: RoundContext, phases: list[Phase]) -> None:
        for phase in phases:
            self.on_phase(ctx.round, phase.name)
            had_uploads = bool(ctx.uploads)
            phase.run(ctx)
            if ctx.uploads and not had_uploads:
                self._check_uploads(ctx, phase.name)
            record = self._snapshot(ctx, phase)
            try:
                for observer in self.observers:
                    observer.on_record(record)
            finally:
                self.protocol.close_phase(record.query)

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

    def _snapshot(self, ctx: RoundContext, phase: Phase) -> RoundRecord:
        """Freeze what crossed the wire so far; tensors are copies observers may keep."""
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
            query=self.protocol.open_phase(ctx, phase.name) if phase.attack_point or phase.name == UPLOAD_PHASE else None,
        )
