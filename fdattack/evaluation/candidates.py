"""The membership candidates: the samples a membership attacker scores, and whose private sample each one is, which
only the evaluator holds (Shi et al., PoPETs 2025, §4.1.4; scored by :mod:`fdattack.evaluation.membership`).

The attacker holds one candidate set (images and labels, :meth:`CandidatePool.as_known`): every client's private samples
and the test samples, or a seeded random part of them, in a shuffled order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import ImageSet

#: origin of a candidate that is nobody's member (a test sample)
NON_MEMBER = -1


@dataclass(frozen=True)
class CandidatePool:
    """The candidates, their labels, and whose private sample each is (:data:`NON_MEMBER` for test samples)."""

    images: Tensor
    labels: Tensor
    origin: Tensor

    def as_known(self) -> ImageSet:
        """What the attacker holds: images and labels, nothing of their origin."""
        n = len(self.labels)
        return ImageSet(self.images, self.labels.clone(), torch.zeros(n, dtype=torch.long), torch.arange(n))


def candidate_pool(split: FederatedSplit, max_candidates: int | None, seed: int) -> CandidatePool:
    """Every private and test sample (or ``max_candidates`` of them, drawn uniformly), in a seeded random order."""
    sets = [*split.private, split.test]
    origin = torch.cat(
        [torch.full((len(s),), k, dtype=torch.long) for k, s in enumerate(split.private)]
        + [torch.full((len(split.test),), NON_MEMBER, dtype=torch.long)]
    )
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(origin))
    if max_candidates is not None:
        order = order[:max_candidates]
    rows = torch.as_tensor(order, dtype=torch.long)
    images = torch.cat([s.images for s in sets])[rows]
    labels = torch.cat([s.labels for s in sets])[rows]
    return CandidatePool(images, labels, origin[rows])
