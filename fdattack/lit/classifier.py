"""The classifier LightningModule used for every client and server model."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from fdattack.data.imageset import UNLABELED, IndexedBatch
from fdattack.models.classifiers import build_classifier

Objective = Callable[[Tensor, IndexedBatch], Tensor]
#: What the steps accept: an :class:`IndexedBatch` dict, an ``(x, y)`` tuple (``TensorDataset``), or ``x`` alone.
Batch = IndexedBatch | Sequence[Tensor] | Tensor


def vmappable(objective: Objective) -> Objective:
    """Declare that ``objective`` runs under ``torch.func.vmap`` exactly as on one model's batch (no branch on the
    data's values, no ``.item()``), so same-architecture models can train with it as one batch
    (:mod:`fdattack.engine.vectorised`). Returns ``objective``."""
    objective.vmappable = True  # type: ignore[attr-defined]
    return objective


def is_vmappable(objective: Objective) -> bool:
    """Whether ``objective`` was declared :func:`vmappable` (a training defense's wrapper is not, unless it says so)."""
    return bool(getattr(objective, "vmappable", False))


@vmappable
def cross_entropy(logits: Tensor, batch: IndexedBatch) -> Tensor:
    """Mean cross-entropy to the hard labels ``batch["y"]`` (unlabeled rows, y = -1, are ignored)."""
    return F.cross_entropy(logits, batch["y"], ignore_index=UNLABELED)


def as_batch(batch: Batch) -> IndexedBatch:
    """The dict form of a batch: dicts pass through, ``(x, y)`` becomes ``{"x": x, "y": y}``, ``x`` becomes ``{"x": x}``."""
    if isinstance(batch, dict):
        return batch
    if isinstance(batch, Tensor):
        return {"x": batch}  # type: ignore[typeddict-item]
    return {"x": batch[0], "y": batch[1]} if len(batch) > 1 else {"x": batch[0]}  # type: ignore[typeddict-item]


class ClassifierLitModule(L.LightningModule):
    """A classifier whose training objective can be switched per phase.

    On its own (``lightning.Trainer`` ``fit`` / ``validate`` / ``test`` / ``predict``) it trains with
    cross-entropy and logs ``train/loss``, ``val/loss``, ``val/acc``, ``test/loss`` and ``test/acc``;
    ``predict_step`` returns logits. Batches are :class:`IndexedBatch` dicts (``{"x", "y", ...}``, what
    :class:`~fdattack.data.FederatedData` yields) or ``(x, y)`` tuples; rows with ``y = -1`` (unlabeled)
    count in neither the loss nor the accuracy. Federated protocols set :attr:`objective` for
    distillation phases (L1 to the consensus, soft cross-entropy to ERA labels, ...) through
    :meth:`use_objective`.

    ``load_from_checkpoint(path)`` needs no arguments when the network was given by its registry name:
    ``ClassifierLitModule("pli_cnn", 10, in_channels=1, image_size=8)`` saves everything needed to rebuild
    it. A network passed as an ``nn.Module`` is not saved in the hyper-parameters; pass it again
    (``load_from_checkpoint(path, net=...)``).

    Args:
        net: a :data:`~fdattack.models.CLASSIFIERS` name (built with ``in_channels``, ``image_size`` and
            ``num_classes``) or any ``nn.Module`` mapping (B, C, H, W) images to (B, num_classes) logits.
        num_classes: J, the number of outputs.
        optimizer: ``"adam"`` or ``"sgd"``.
        lr, weight_decay, momentum, nesterov: optimizer settings.
        in_channels, image_size: C and H of the images, when ``net`` is a name.
    """

    def __init__(
        self,
        net: nn.Module | str,
        num_classes: int,
        optimizer: str = "adam",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        nesterov: bool = False,
        in_channels: int | None = None,
        image_size: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(net, str):
            if in_channels is None or image_size is None:
                raise TypeError(f"ClassifierLitModule({net!r}, ...) needs in_channels and image_size to build the network")
            self.save_hyperparameters()
            net = build_classifier(net, in_channels, image_size, num_classes)
        else:
            self.save_hyperparameters(ignore=["net"])
        self.net = net
        self.objective: Objective = cross_entropy
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def use_objective(self, objective: Objective) -> "ClassifierLitModule":
        """Set the loss of :meth:`training_step`; returns ``self`` for chaining."""
        self.objective = objective
        return self

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        batch = as_batch(batch)
        loss = self.objective(self(batch["x"]), batch)
        if self._trainer is not None:  # fdattack's Fabric engine averages the loss itself, without a sync per step
            self.log("train/loss", loss, prog_bar=True)
        return loss

    def _evaluate(self, batch: Batch, stage: str, accuracy: MulticlassAccuracy) -> None:
        """Loss and accuracy over the labeled rows of ``batch``, logged as ``<stage>/loss`` and ``<stage>/acc``."""
        batch = as_batch(batch)
        labeled = batch["y"] != UNLABELED
        n = int(labeled.sum())
        if n == 0:
            return
        logits, y = self(batch["x"][labeled]), batch["y"][labeled]
        accuracy(logits, y)
        self.log(f"{stage}/loss", F.cross_entropy(logits, y), batch_size=n)
        self.log(f"{stage}/acc", accuracy, on_epoch=True, prog_bar=True, batch_size=n)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_acc)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_acc)

    def predict_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """Logits (B, J) of the batch's images."""
        return self(as_batch(batch)["x"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp: Any = self.hparams
        if hp.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        if hp.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay, momentum=hp.momentum, nesterov=hp.nesterov)
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {hp.optimizer!r}")
