"""Ground-truth scoring of reconstructions (evaluation side: it reads private data, attacks never do)."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import ImageSet
from fdattack.fd.engine import FitJob, LocalTrainer
from fdattack.lit.classifier import ClassifierLitModule, cross_entropy
from fdattack.metrics.attack_accuracy import attack_accuracy, class_means
from fdattack.metrics.identity import IdentityScorer, topk_accuracy
from fdattack.metrics.image import standard_ssim
from fdattack.models.classifiers import build_classifier


def train_identity_scorer(split: FederatedSplit, engine: LocalTrainer, architecture: str, epochs: int, lr: float,
                          seed: int) -> IdentityScorer:
    """An evaluation classifier over the target labels, apart from every federated model.

    It learns the targets' private training images pooled over clients (what the attacks try to recover) and
    reports its top-1 on their held-out test images (labels outside the targets are left out).
    """
    targets = list(split.target_labels)
    remap = torch.full((split.num_classes + 1,), -1, dtype=torch.long)
    remap[torch.tensor(targets)] = torch.arange(len(targets))
    private = ImageSet.from_images(torch.cat([p.images for p in split.private]), remap[torch.cat([p.labels for p in split.private])])
    private = private.subset(torch.nonzero(private.labels >= 0).flatten())
    test = split.test.subset(torch.nonzero(remap[split.test.labels.clamp(min=0)] >= 0).flatten())
    c, size = split.image_shape[0], split.image_shape[-1]
    with torch.random.fork_rng(devices=[]):  # seeded initialisation that leaves the run's random stream alone
        torch.manual_seed(seed)
        module = ClassifierLitModule(build_classifier(architecture, c, size, len(targets)), len(targets), lr=lr)
    handle = engine.setup("evaluation_classifier", module)
    engine.fit(FitJob(handle, private, epochs, cross_entropy, seed))
    test_logits = engine.predict(handle, test.images)
    test_accuracy = topk_accuracy(test_logits, remap[test.labels], 1) if len(test) else float("nan")
    return IdentityScorer(lambda images: engine.predict(handle, images), targets, test_accuracy)


def reconstruction_scorer(split: FederatedSplit, identity: Optional[IdentityScorer] = None) -> Callable[[Tensor, Tensor], tuple[dict[str, float], Tensor]]:
    """``(reconstructions (T,C,H,W), labels (T,)) -> (metrics, grid)``.

    Metrics: accuracy, ssim, ssim_standard, too_close_to_public, chance, and with ``identity`` eval_top1,
    eval_top5 and eval_classifier_accuracy. The grid (C, T*H, 3W) in [0, 1] has one row per target: the
    reconstruction, the private mean and the public mean of its label. Private means pool every client's
    private images (pli.md §13.14); public means mix both looks.
    """
    private = torch.cat([p.images for p in split.private])
    private_labels = torch.cat([p.labels for p in split.private])
    private_means = class_means(private, private_labels, split.num_classes)
    public_means = class_means(split.public.images, split.public.labels, split.num_classes)

    def score(recon: Tensor, labels: Tensor) -> tuple[dict[str, float], Tensor]:
        result = attack_accuracy(recon, labels, private_means, public_means)
        columns = [recon, private_means[labels], torch.nan_to_num(public_means[labels], nan=-1.0)]
        grid = torch.cat([torch.cat(list(column), dim=-2) for column in columns], dim=-1)
        metrics = {
            "accuracy": result.accuracy,
            "ssim": result.ssim_private_mean,
            "ssim_standard": float(standard_ssim(recon, private_means[labels]).mean()),
            "too_close_to_public": float(result.too_close_to_public),
            "chance": 1.0 / len(labels),
        }
        if identity is not None:
            metrics.update(identity(recon, labels))
        return metrics, (grid * 0.5 + 0.5).clamp(0, 1)

    return score
