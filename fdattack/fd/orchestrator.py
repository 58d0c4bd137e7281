"""Runs rounds of named phases and publishes a :class:`RoundRecord` after each phase."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Sequence

import torch

from fdattack.errors import UploadError
from fdattack.fd.engine import derive_seed
from fdattack.fd.evaluation import Oracle, protocol_metrics
from fdattack.fd.protocols.base import Phase, Protocol, RoundContext
from fdattack.fd.record import RoundRecord
from fdattack.observers.base import Observer, ObserverOutput

log = logging.getLogger(__name__)


@dataclass
class RoundResult:
    """Everything a round produced, handed to the run's recorders."""

    round: int
    metrics: dict[str, float]
    histograms: dict[str, torch.Tensor] = field(default_factory=dict)
    images: dict[str, torch.Tensor] = field(default_factory=dict)
    artifacts: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    dropped: list[int] = field(default_factory=list)


class RoundOrchestrator:
    """Drives a protocol's phases, checks uploads, and notifies observers.

    Args:
        protocol: the simulated protocol.
        observers: attacks and diagnostics, called after every phase and at every round end.
        oracle: ground truth for the protocol's utility metrics.
        on_bad_upload: ``"error"`` stops at a NaN/inf upload; ``"drop"`` leaves that client out of the round.
        on_phase: called with the phase name before it runs (progress display).
    """

    def __init__(self, protocol: Protocol, observers: Sequence[Observer], oracle: Oracle, on_bad_upload: str = "error",
                 on_phase: Callable[[str], None] | None = None) -> None:
        self.protocol = protocol
        self.observers = list(observers)
        self.oracle = oracle
        self.on_bad_upload = on_bad_upload
        self.on_phase = on_phase or (lambda name: None)

    def run_setup(self) -> RoundResult:
        """Round 0: the protocol's set-up phases (transfer learning, warm-up)."""
        ctx = RoundContext(round=0, participants=list(range(self.protocol.num_clients)))
        self._run_phases(ctx, self.protocol.setup_phases())
        return RoundResult(round=0, metrics={**ctx.metrics, **protocol_metrics(self.oracle)})

    def run_round(self, round: int) -> RoundResult:
        """One communication round: every phase, one record per phase, then the observers' reports."""
        torch.manual_seed(derive_seed(self.protocol.seed, "round", round))
        ctx = RoundContext(round=round, participants=self.protocol.participants(round), public_indices=self.protocol.public_indices(round))
        self._run_phases(ctx, self.protocol.round_phases(round))
        result = RoundResult(round=round, metrics=dict(ctx.metrics), dropped=list(ctx.dropped))
        result.metrics.update(protocol_metrics(self.oracle))
        result.metrics["protocol/dropped_uploads"] = float(len(ctx.dropped))
        for observer in self.observers:
            out: ObserverOutput = observer.on_round_end(round)
            result.metrics.update(out.metrics)
            result.histograms.update(out.histograms)
            result.images.update(out.images)
            result.artifacts.update(out.artifacts)
        return result

    def _run_phases(self, ctx: RoundContext, phases: list[Phase]) -> None:
        for phase in phases:
            self.on_phase(phase.name)
            had_uploads = bool(ctx.uploads)
            phase.run(ctx)
            if ctx.uploads and not had_uploads:
                self._check_uploads(ctx, phase.name)
            record = self._snapshot(ctx, phase)
            for observer in self.observers:
                observer.on_record(record)

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
            public_indices=None if ctx.public_indices is None else ctx.public_indices.clone(),
            uploads=MappingProxyType({k: u.frozen_copy() for k, u in ctx.uploads.items()}),
            aggregate=None if ctx.aggregate is None else ctx.aggregate.detach().clone(),
            aggregate_kind=ctx.aggregate_kind,
            global_state=None if ctx.global_state is None else MappingProxyType({k: v.clone() for k, v in ctx.global_state.items()}),
            server_outputs=None if ctx.server_outputs is None else ctx.server_outputs.detach().clone(),
            attack_point=phase.attack_point,
            query=self.protocol.public_query(),
        )
