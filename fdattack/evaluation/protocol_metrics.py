"""The protocol's utility metrics, measured on ground truth: client and server test accuracy."""

from __future__ import annotations

import torch

from fdattack.evaluation.oracle import Oracle
from fdattack.functional import topk_accuracy


def protocol_metrics(oracle: Oracle) -> dict[str, float]:
    """``protocol/client_acc_{mean,min,max}`` on each client's test set (where the protocol reports them) and
    ``protocol/server_acc``."""
    tests = [oracle.client_test_set(k) for k in range(len(oracle.clients))] if oracle.client_accuracy else []
    if tests and all(test is oracle.split.test for test in tests):  # no client owns labels: one test set, one engine call
        logits = list(oracle.engine.predict_many(oracle.clients, oracle.split.test)) if len(oracle.split.test) else []
    else:
        logits = [oracle.predict(handle, test) for handle, test in zip(oracle.clients, tests) if len(test)]
    accs = [topk_accuracy(z, test.labels) for z, test in zip(logits, [t for t in tests if len(t)])]
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
