"""Ground truth: what only the evaluation side holds (never handed to an attack)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import ImageSet
from fdattack.engine import LocalTrainer, ModelHandle


@dataclass(frozen=True)
class Oracle:
    """Everything the evaluation side may see: the split (private data included) and the models.

    The evaluator and its diagnostics get an Oracle; attacks get an :class:`~fdattack.fd.threat.AttackerView`
    and the round records only (``tests/test_threat_model.py`` checks that no attack reaches one).
    ``client_accuracy`` is the protocol's :attr:`~fdattack.fd.protocols.base.Protocol.client_accuracy`.
    """

    split: FederatedSplit
    engine: LocalTrainer
    clients: tuple[ModelHandle, ...]
    server: ModelHandle | None
    client_accuracy: bool = True

    def client_test_set(self, k: int) -> ImageSet:
        """Test images of client k's own labels when labels are owned (PLI split), else the whole test set."""
        test = self.split.test
        owned = [label for label, owner in self.split.owner.items() if owner == k]
        if not owned:
            return test
        mask = torch.isin(test.labels, torch.as_tensor(owned))
        return test.subset(torch.nonzero(mask).flatten())

    def predict(self, handle: ModelHandle, images: ImageSet | Tensor) -> Tensor:
        return self.engine.predict(handle, images)
