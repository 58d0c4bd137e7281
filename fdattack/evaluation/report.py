"""What the evaluation side hands to the run's recorders at the end of a round."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class Report:
    """Metrics, histograms, images and artifacts of one round.

    Attributes:
        metrics: flat ``protocol/...``, ``attack/<name>/<metric>`` or ``diag/<name>/<metric>`` scalars.
        histograms: key -> 1-D tensor of values, or ``(counts, edges)`` already binned (logged as W&B histograms).
        images: key -> (C, H, W) image in [0, 1] (logged as W&B images and PNGs).
        artifacts: name -> tensors saved as ``output_dir/artifacts/<name>_round_XXXX.pt`` (weights_only loadable).
    """

    metrics: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Tensor | tuple[Tensor, Tensor]] = field(default_factory=dict)
    images: dict[str, Tensor] = field(default_factory=dict)
    artifacts: dict[str, dict[str, Tensor]] = field(default_factory=dict)

    def update(self, other: "Report") -> None:
        """Add ``other``'s entries (later keys win)."""
        self.metrics.update(other.metrics)
        self.histograms.update(other.histograms)
        self.images.update(other.images)
        self.artifacts.update(other.artifacts)
