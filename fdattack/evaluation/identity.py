"""The evaluation classifier behind ``eval_top1``/``eval_top5``: trained on ground truth, apart from every federated model."""

from __future__ import annotations

import torch

from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import ImageSet
from fdattack.fd.engine import FitJob, LocalTrainer
from fdattack.lit.classifier import ClassifierLitModule, cross_entropy
from fdattack.functional import topk_accuracy
from fdattack.metrics.identity import IdentityScorer
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
