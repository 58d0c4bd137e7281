"""Ground-truth scoring of reconstructions (evaluation side: it reads private data, attacks never do)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from fdattack.data.federated import FederatedSplit
from fdattack.metrics.attack_accuracy import attack_accuracy, class_means
from fdattack.metrics.image import standard_ssim


def reconstruction_scorer(split: FederatedSplit) -> Callable[[Tensor, Tensor], tuple[dict[str, float], Tensor]]:
    """``(reconstructions (T,C,H,W), labels (T,)) -> (metrics, grid)``.

    Metrics: accuracy, ssim, ssim_standard, too_close_to_public, chance. The grid (C, 3H, T*W) in [0, 1]
    has one column per target: the reconstruction, the private mean and the public mean of its label.
    Private means pool every client's private images (pli.md §13.14); public means mix both looks.
    """
    private = torch.cat([p.images for p in split.private])
    private_labels = torch.cat([p.labels for p in split.private])
    private_means = class_means(private, private_labels, split.num_classes)
    public_means = class_means(split.public.images, split.public.labels, split.num_classes)

    def score(recon: Tensor, labels: Tensor) -> tuple[dict[str, float], Tensor]:
        result = attack_accuracy(recon, labels, private_means, public_means)
        rows = [recon, private_means[labels], torch.nan_to_num(public_means[labels], nan=-1.0)]
        grid = torch.cat([torch.cat(list(row), dim=-1) for row in rows], dim=-2)
        metrics = {
            "accuracy": result.accuracy,
            "ssim": result.ssim_private_mean,
            "ssim_standard": float(standard_ssim(recon, private_means[labels]).mean()),
            "too_close_to_public": float(result.too_close_to_public),
            "chance": 1.0 / len(labels),
        }
        return metrics, (grid * 0.5 + 0.5).clamp(0, 1)

    return score
