"""Ground-truth scoring of reconstructions (pli.md §10): it reads private data, so attacks never hold it."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fdattack.data.federated import FederatedSplit
from fdattack.functional.intervals import bootstrap_mean_interval, interval_keys, wilson_interval
from fdattack.metrics.attack_accuracy import attack_accuracy, class_means
from fdattack.metrics.identity import IdentityScorer
from fdattack.metrics.image import standard_ssim


class ReconstructionScorer:
    """``(reconstructions (T,C,H,W), labels (T,)) -> (metrics, grid)`` against the private and public class means.

    Metrics: accuracy, ssim, ssim_standard, too_close_to_public, chance, and with ``identity`` eval_top1,
    eval_top5 and eval_classifier_accuracy; 95 % intervals (``_ci_low``, ``_ci_high``) beside accuracy, eval_top1 and
    eval_top5 (Wilson over the T targets) and both SSIMs (the percentile bootstrap over the targets). The grid (C, T*H, 3W) in [0, 1] has one row per target: the
    reconstruction, the private mean and the public mean of its label. Private means pool every client's
    private images (pli.md §13.14); public means mix both looks, with the true public labels.

    Args:
        split: the ground truth.
        identity: the evaluation classifier, or None.
    """

    def __init__(self, split: FederatedSplit, identity: Optional[IdentityScorer] = None) -> None:
        private = torch.cat([p.images for p in split.private])
        private_labels = torch.cat([p.labels for p in split.private])
        self.private_means = class_means(private, private_labels, split.num_classes)
        self.public_means = class_means(split.public.images, split.public.labels, split.num_classes)
        self.identity = identity

    def __call__(self, recon: Tensor, labels: Tensor) -> tuple[dict[str, float], Tensor]:
        result = attack_accuracy(recon, labels, self.private_means, self.public_means)
        columns = [recon, self.private_means[labels], torch.nan_to_num(self.public_means[labels], nan=-1.0)]
        grid = torch.cat([torch.cat(list(column), dim=-2) for column in columns], dim=-1)
        targets = len(labels)
        standard = standard_ssim(recon, self.private_means[labels])
        metrics = {
            "accuracy": result.accuracy,
            **interval_keys("accuracy", wilson_interval(int(result.success.sum()), targets)),
            "ssim": result.ssim_private_mean,
            **interval_keys("ssim", bootstrap_mean_interval(result.ssim_per_target.numpy())),
            "ssim_standard": float(standard.mean()),
            **interval_keys("ssim_standard", bootstrap_mean_interval(standard.numpy())),
            "too_close_to_public": float(result.too_close_to_public),
            "chance": 1.0 / targets,
        }
        if self.identity is not None:
            identity = self.identity(recon, labels)
            metrics.update(identity)
            for key in ("eval_top1", "eval_top5"):
                if key in identity:
                    metrics.update(interval_keys(key, wilson_interval(round(identity[key] * targets), targets)))
        return metrics, (grid * 0.5 + 0.5).clamp(0, 1)
