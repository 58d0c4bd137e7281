"""The classifier LightningModule used for every client and server model."""

from __future__ import annotations

from typing import Callable

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from fdattack.data.imageset import IndexedBatch

Objective = Callable[[Tensor, IndexedBatch], Tensor]


def cross_entropy(logits: Tensor, batch: IndexedBatch) -> Tensor:
    """Mean cross-entropy to the hard labels ``batch["y"]`` (unlabeled rows, y = -1, are ignored)."""
    return F.cross_entropy(logits, batch["y"], ignore_index=-1)


class ClassifierLitModule(L.LightningModule):
    """A classifier whose training objective can be switched per phase.

    On its own (``lightning.Trainer.fit`` with loaders of :class:`IndexedBatch` dicts) it trains with
    cross-entropy. Federated protocols set :attr:`objective` for distillation phases (L1 to the
    consensus, soft cross-entropy to ERA labels, ...) through :meth:`use_objective`.

    Args:
        net: any ``nn.Module`` mapping (B, C, H, W) images to (B, num_classes) logits.
        num_classes: J, the number of outputs.
        optimizer: ``"adam"`` or ``"sgd"``.
        lr, weight_decay, momentum, nesterov: optimizer settings.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        optimizer: str = "adam",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net"])
        self.net = net
        self.objective: Objective = cross_entropy
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def use_objective(self, objective: Objective) -> "ClassifierLitModule":
        """Set the loss of :meth:`training_step`; returns ``self`` for chaining."""
        self.objective = objective
        return self

    def training_step(self, batch: IndexedBatch, batch_idx: int) -> Tensor:
        return self.objective(self(batch["x"]), batch)

    def validation_step(self, batch: IndexedBatch, batch_idx: int) -> None:
        self.val_acc(self(batch["x"]), batch["y"])
        self.log("val/acc", self.val_acc, on_epoch=True, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        if hp.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        if hp.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay, momentum=hp.momentum, nesterov=hp.nesterov)
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {hp.optimizer!r}")
