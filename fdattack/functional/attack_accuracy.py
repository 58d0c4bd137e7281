"""PLI's attack accuracy: the SSIM nearest-mean criterion (Takahashi et al., CVPR 2023, §4.1; the means as the authors' code takes them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.functional.image import pairwise_ssim


@dataclass(frozen=True)
class AttackAccuracy:
    """Scores of one set of reconstructions.

    Attributes:
        accuracy: fraction of targets whose reconstruction is most similar to its own private mean.
        too_close_to_public: number of targets whose best match is the public mean of the same label.
        ssim_private_mean: mean SSIM of each reconstruction to its own private mean (the paper's "quality").
        success: (T,) bool per target.
        ssim_per_target: (T,) SSIM of each reconstruction to its own private mean (NaN where it has no score).
    """

    accuracy: float
    too_close_to_public: int
    ssim_private_mean: float
    success: Tensor
    ssim_per_target: Tensor


def attack_accuracy(recon: Tensor, recon_labels: Tensor, private_means: Tensor, public_means: Tensor) -> AttackAccuracy:
    """A reconstruction of label j succeeds iff its paper SSIM to the private mean of j beats its SSIM to every
    other label's private mean and to every label's public mean (ties go to the lower index, as the
    authors' ``nanargmax`` over [private means | public means]). A reconstruction with no score (NaN
    pixels) fails; with no score at all the accuracy is NaN, not a count of hits on label 0.

    Args:
        recon: (T, C, H, W) one reconstruction per target, in [-1, 1].
        recon_labels: (T,) the target label each reconstruction claims.
        private_means: (J, C, H, W) per-label mean of the private (training) images; NaN rows for labels without private data.
        public_means: (J, C, H, W) per-label mean of the public images (sensitive and auxiliary looks mixed); NaN where absent.
    """
    j = private_means.shape[0]
    references = torch.cat([private_means, public_means])
    valid = ~torch.isnan(references.flatten(1)).any(dim=1)
    scores = torch.full((recon.shape[0], references.shape[0]), float("nan"))
    scores[:, valid] = pairwise_ssim(recon, references[valid])
    scored = ~torch.isnan(scores).all(dim=1)  # a NaN reconstruction has no score: a miss, never argmax 0
    best = torch.where(torch.isnan(scores), torch.tensor(float("-inf")), scores).argmax(dim=1)
    labels = recon_labels.long()
    success = (best == labels) & scored
    own = scores[torch.arange(len(labels)), labels]
    return AttackAccuracy(
        accuracy=float(success.float().mean()) if bool(scored.any()) else float("nan"),
        too_close_to_public=int(((best == labels + j) & scored).sum()),
        ssim_private_mean=float(own.nanmean()) if len(labels) else float("nan"),
        success=success,
        ssim_per_target=own,
    )


def class_means(images: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """(J, C, H, W) per-label pixel means; NaN for labels with no image (ignored by :func:`attack_accuracy`)."""
    means = torch.full((num_classes, *images.shape[1:]), float("nan"))
    for label in labels.unique():
        if label >= 0:
            means[label] = images[labels == label].mean(dim=0)
    return means
