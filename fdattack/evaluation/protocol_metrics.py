"""The protocol's utility metrics, measured on ground truth: client and server test accuracy.

Every client is scored on the whole held-out test set (``protocol/client_acc_{mean,min,max}``). Where the split gives
each client labels of its own (``data.split=pli``: disjoint target identities), each client is also scored on the
test images of its own labels alone (``protocol/client_acc_own_{mean,min,max}``). The own-label figure was the only
one before: on AT&T faces a client holds 5 identities with one test image each, scored 1.00 in every cell (the
revisit epochs on its private images fit them whatever the uploads carry), so no defense could show a utility cost
there. The whole test set adds the other clients' identities, which a client knows only from their public (blurred)
look and from the consensus it distils; it is what the collaboration buys and what an upload defense can spend.
"""

from __future__ import annotations

import torch

from fdattack.evaluation.oracle import Oracle
from fdattack.functional import topk_accuracy


def _summary(prefix: str, accs: list[float]) -> dict[str, float]:
    t = torch.tensor(accs)
    return {f"{prefix}_mean": float(t.nanmean()), f"{prefix}_min": float(t.min()), f"{prefix}_max": float(t.max())}


def protocol_metrics(oracle: Oracle) -> dict[str, float]:
    """``protocol/client_acc_{mean,min,max}`` of every client on the whole test set (where the protocol reports
    client accuracy), ``protocol/client_acc_own_{mean,min,max}`` on each client's own labels (where clients own
    labels) and ``protocol/server_acc``."""
    test = oracle.split.test
    metrics: dict[str, float] = {}
    if oracle.client_accuracy and oracle.clients and len(test):
        logits = list(oracle.engine.predict_many(oracle.clients, test))  # one engine call for every client
        metrics.update(_summary("protocol/client_acc", [topk_accuracy(z, test.labels) for z in logits]))
        own = []
        for k, z in enumerate(logits):
            owned = [label for label, owner in oracle.split.owner.items() if owner == k]
            mask = torch.isin(test.labels, torch.as_tensor(owned, dtype=torch.long))
            if owned and bool(mask.any()):
                own.append(topk_accuracy(z[mask], test.labels[mask]))
        if own:
            metrics.update(_summary("protocol/client_acc_own", own))
    if oracle.server is not None and len(test):
        metrics["protocol/server_acc"] = topk_accuracy(oracle.predict(oracle.server, test), test.labels)
    return metrics
