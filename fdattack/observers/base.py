"""Observers of round records: attacks (public view only) and diagnostics (ground-truth view)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from fdattack.fd.record import RoundRecord


@dataclass
class ObserverOutput:
    """What an observer reports at the end of a round.

    Attributes:
        metrics: flat ``attack/<name>/<metric>`` or ``diag/<name>/<metric>`` scalars.
        histograms: key -> 1-D tensor of values (logged as W&B histograms).
        images: key -> (C, H, W) image in [0, 1] (logged as W&B images and PNGs).
        artifacts: name -> tensors saved as ``output_dir/artifacts/<name>_round_XXXX.pt`` (weights_only loadable).
    """

    metrics: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Tensor] = field(default_factory=dict)
    images: dict[str, Tensor] = field(default_factory=dict)
    artifacts: dict[str, dict[str, Tensor]] = field(default_factory=dict)


class Observer:
    """Receives every :class:`RoundRecord`; reports at the end of each round.

    Subclasses override what they need. ``state_dict``/``load_state_dict`` make them resumable.
    """

    name: str = "observer"

    def on_record(self, record: RoundRecord) -> None:
        """Called after every phase."""

    def on_round_end(self, round: int) -> ObserverOutput:
        """Called once per round after its last phase."""
        return ObserverOutput()

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
