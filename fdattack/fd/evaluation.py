"""Ground truth and the protocol's own utility metrics (never handed to an attack)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import ImageSet
from fdattack.fd.engine import LocalTrainer, ModelHandle


@dataclass(frozen=True)
class Oracle:
    """Everything the evaluation side may see: the split (private data included) and the models.

    Diagnostics and metrics get an Oracle; attacks get only :class:`~fdattack.fd.record.RoundRecord`.
    """

    split: FederatedSplit
    engine: LocalTrainer
    clients: tuple[ModelHandle, ...]
    server: ModelHandle | None

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


def accuracy(logits: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy over rows with a label (>= 0); NaN when there are none."""
    keep = labels >= 0
    if not bool(keep.any()):
        return float("nan")
    return float((logits[keep].argmax(dim=-1) == labels[keep]).float().mean())


def protocol_metrics(oracle: Oracle) -> dict[str, float]:
    """``protocol/client_acc_{mean,min,max}`` on each client's test set and ``protocol/server_acc``."""
    accs = []
    for k, handle in enumerate(oracle.clients):
        test = oracle.client_test_set(k)
        if len(test):
            accs.append(accuracy(oracle.predict(handle, test), test.labels))
    metrics: dict[str, float] = {}
    if accs:
        t = torch.tensor(accs)
        metrics.update({
            "protocol/client_acc_mean": float(t.nanmean()),
            "protocol/client_acc_min": float(t.min()),
            "protocol/client_acc_max": float(t.max()),
        })
    if oracle.server is not None and len(oracle.split.test):
        metrics["protocol/server_acc"] = accuracy(oracle.predict(oracle.server, oracle.split.test), oracle.split.test.labels)
    return metrics
