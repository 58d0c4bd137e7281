"""LabelAvg's client side as an upload transform: a client sends its top-K labels and their weights (Xiao et al., DSN
2024, §V-B, Eqs. 7-10).

Not a user-selectable defense: ``protocol=labelavg`` builds it from its own config and puts it first among the
upload defenses, so that the round's uploads and every answer to a query alike are top-K label uploads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.defenses.base import Release, UploadDefense
from fdattack.functional.label_avg import LabelWeights, label_vector, top_k_labels, top_k_upload_bytes


@dataclass
class LabelAvgUploadSettings:
    k: int = 3  #: K, labels sent per sample
    weights: LabelWeights = "beta"  #: ``beta`` (Eq. 10) or ``ones``


class LabelAvgUpload(UploadDefense):
    """Turns an (M, C) payload into w_P ⊙ v_P: β at the K most probable labels, zeros elsewhere (Eqs. 7-10).

    Logits are turned into probabilities first (softmax). On the wire: K labels and K weights per row, 4 bytes each.
    """

    name = "labelavg"
    Settings = LabelAvgUploadSettings

    def transform(self, payload: Tensor, release: Release) -> Tensor:
        probs = torch.softmax(payload, dim=-1) if release.kind == "logits" else payload
        labels, weights = top_k_labels(probs, int(self.settings.k), self.settings.weights)
        return label_vector(labels, weights, payload.shape[-1])

    def encoded_bytes(self, payload: Tensor, release: Release, size: int) -> int:
        return top_k_upload_bytes(payload.shape[0], int(self.settings.k))
