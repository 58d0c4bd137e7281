"""A student distilled from a teacher's outputs on public samples: Distillation-based LiRA's reference model
(Shi et al., PoPETs 2025, §3.3.2), usable on its own in any Lightning project."""

from __future__ import annotations

from typing import Literal

from torch import nn

from fdattack.lit.classifier import ClassifierLitModule
from fdattack.lit.objectives import kl_to_probs, l1_to_logits

#: the student's loss: L1 between its logits and the teacher's (the authors' ``nn.L1Loss``), or KL(p_teacher ‖ softmax)
StudentLoss = Literal["l1", "kl"]


class DistillationStudent(ClassifierLitModule):
    """A classifier trained to match a teacher's outputs: batches ``{"x": images, "target": teacher outputs}``.

    With ``loss="l1"`` the targets are the teacher's logits (FedMD and DS-FL uploads, the authors' code); with ``loss="kl"`` they
    are its probabilities (Cronus uploads, a choice: the paper does not say). Adam with learning rate ``lr`` (the
    authors' 1e-3). Under a plain ``lightning.Trainer`` it logs ``train/loss``; ``predict_step`` returns logits.

    Args:
        net: a classifier registry name (built with ``in_channels`` and ``image_size``) or an ``nn.Module``.
        num_classes: M, the number of outputs.
        loss: ``"l1"`` or ``"kl"``.
        lr: Adam's learning rate.
        in_channels, image_size: C and H of the images, when ``net`` is a name.
    """

    def __init__(
        self,
        net: nn.Module | str,
        num_classes: int,
        loss: StudentLoss = "l1",
        lr: float = 1e-3,
        in_channels: int | None = None,
        image_size: int | None = None,
    ) -> None:
        super().__init__(net, num_classes, optimizer="adam", lr=lr, in_channels=in_channels, image_size=image_size)
        if loss not in ("l1", "kl"):
            raise ValueError(f"loss must be 'l1' or 'kl', got {loss!r}")
        self.use_objective(l1_to_logits if loss == "l1" else kl_to_probs)
