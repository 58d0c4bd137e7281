"""The protocol's utility metrics, measured on ground truth: client and server test accuracy."""

from __future__ import annotations

import torch
from torch import Tensor

from fdattack.evaluation.oracle import Oracle


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
