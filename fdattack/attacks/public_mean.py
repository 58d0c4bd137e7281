"""The public-mean baseline: every target reconstructed as a mean public image, with no model access at all.

It reads nothing from the protocol: per target label j, the mean of the public images labeled j where
the attacker knows labels and has some (the insensitive look of j in PLI's split), else the mean
sensitive public image (PLI's Eq. 8 naive prior). Whatever an inversion attack scores above this, it
learned from the clients' outputs; it is the floor every reconstruction attack must beat.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.attacks.base import ATTACKS, Attack, AttackContext
from fdattack.attacks.results import AttackResult, Reconstructions
from fdattack.data.imageset import SENSITIVE
from fdattack.errors import ConfigError
from fdattack.fd.threat import AttackerView, Capability, ViewPart
from fdattack.knobs import knob


@dataclass
class PublicMeanSettings:
    per_label: bool = knob(
        True, "use the mean of the public images labeled j where the labels are known (else the mean sensitive public image for every j)"
    )


def public_means(view: AttackerView, per_label: bool) -> Tensor:
    """(T, C, H, W): one mean public image per target label of ``view``."""
    assert view.public is not None
    public = view.public
    sensitive = public.domain == SENSITIVE
    fallback = public.images[sensitive].mean(dim=0) if bool(sensitive.any()) else public.images.mean(dim=0)
    means = []
    for j in view.target_labels:
        rows = public.labels == j
        means.append(public.images[rows].mean(dim=0) if per_label and bool(rows.any()) else fallback)
    return torch.stack(means)


@ATTACKS.register("public_mean")
class PublicMeanAttack(Attack):
    """Reports the same mean public images every round (scored like any reconstruction)."""

    name = "public_mean"
    Settings = PublicMeanSettings
    needs = frozenset({Capability.public_data, Capability.private_targets})
    reads = frozenset({ViewPart.public})
    produces = frozenset({Reconstructions})

    def __init__(self, view: AttackerView, settings: PublicMeanSettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        if view.public is None:
            raise ConfigError(f"attacks: public_mean averages public images, and protocol {view.protocol} has none; set attacks=[]")
        self.images = public_means(view, settings.per_label)
        self.targets = torch.as_tensor(view.target_labels, dtype=torch.long)

    def on_round_end(self, round: int) -> list[AttackResult]:
        return [Reconstructions(self.images.clone(), self.targets.clone())]
