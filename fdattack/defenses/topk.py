"""Top-k truncation of uploads: a client sends only its k largest outputs per sample."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.defenses.base import DEFENSES, FLOAT_BYTES, Release, UploadDefense
from fdattack.knobs import knob


@dataclass
class TopKSettings:
    k: int = knob(1, "entries kept per sample (the k largest)", ge=1)


def truncate_probs(probs: Tensor, k: int) -> Tensor:
    """Keep the k largest probabilities of each row; spread the remaining mass evenly over the other J - k classes.

    The receiver knows the row sums to 1, so the even spread is the maximum-entropy completion of what was sent.
    """
    j = probs.shape[-1]
    if k >= j:
        return probs
    top, idx = probs.topk(k, dim=-1)
    rest = (1 - top.sum(dim=-1, keepdim=True)).clamp_min(0) / (j - k)
    return rest.expand_as(probs).clone().scatter_(-1, idx, top)


def truncate_logits(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row exactly; fill the others so that softmax gives :func:`truncate_probs`.

    This is what the receiver can rebuild from the k logits and the row's log-partition (one more number):
    the missing classes get log((1 - Σ top-k softmax) / (J - k)) + logsumexp(row).
    """
    j = logits.shape[-1]
    if k >= j:
        return logits
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    top, idx = logits.topk(k, dim=-1)
    rest_mass = (1 - torch.exp(top - log_z).sum(dim=-1, keepdim=True)).clamp_min(torch.finfo(logits.dtype).tiny)
    fill = torch.log(rest_mass / (j - k)) + log_z
    return fill.expand_as(logits).clone().scatter_(-1, idx, top)


def index_bytes(num_classes: int) -> int:
    """Bytes of one class index on the wire (1 up to 256 classes, 2 up to 65,536, else 4)."""
    bits = max(math.ceil(math.log2(max(num_classes, 2))), 1)
    return 1 if bits <= 8 else 2 if bits <= 16 else 4


@DEFENSES.register("topk")
class TopKDefense(UploadDefense):
    """Sends the k largest entries of each output row (values and class indices) and nothing else.

    Logit payloads add one float per row (the log-partition) so that the receiver completes the row as
    :func:`truncate_logits`; probability payloads need nothing more (:func:`truncate_probs`).
    """

    name = "topk"
    Settings = TopKSettings

    def transform(self, payload: Tensor, release: Release) -> Tensor:
        k = int(self.settings.k)
        return truncate_logits(payload, k) if release.kind == "logits" else truncate_probs(payload, k)

    def encoded_bytes(self, payload: Tensor, release: Release, size: int) -> int:
        n, j = payload.shape
        k = min(int(self.settings.k), j)
        if k >= j:
            return size
        per_row = k * (FLOAT_BYTES + index_bytes(j)) + (FLOAT_BYTES if release.kind == "logits" else 0)
        return min(size, n * per_row)
