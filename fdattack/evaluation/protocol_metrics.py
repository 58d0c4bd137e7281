"""The protocol's utility metrics, measured on ground truth: client and server test accuracy."""

from __future__ import annotations

import torch

from fdattack.evaluation.oracle import Oracle
from fdattack.functional import topk_accuracy


def protocol_metrics(oracle: Oracle) -> dict[str, float]:
    """``protocol/client_acc_{mean,min,max}`` on each client's test set and ``protocol/server_acc``."""
    accs = []
    for k, handle in enumerate(oracle.clients):
        test = oracle.client_test_set(k)
        if len(test):
            accs.append(topk_accuracy(oracle.predict(handle, test), test.labels))
    metrics: dict[str, float] = {}
    if accs:
        t = torch.tensor(accs)
        metrics.update({
            "protocol/client_acc_mean": float(t.nanmean()),
            "protocol/client_acc_min": float(t.min()),
            "protocol/client_acc_max": float(t.max()),
        })
    if oracle.server is not None and len(oracle.split.test):
        metrics["protocol/server_acc"] = topk_accuracy(oracle.predict(oracle.server, oracle.split.test), oracle.split.test.labels)
    return metrics
