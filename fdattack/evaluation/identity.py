"""The evaluation classifier behind ``eval_top1``/``eval_top5``: trained on ground truth, apart from every federated model.

It cannot be won by copying the public look. Its classes are not the T target labels alone (with 5 targets or fewer
that made ``eval_top5`` 1.0 for any image, and a copy of the targets' blurred public look scored high: TBI with attack
accuracy 0.00 had eval top-1 0.80 on the default run) but, in this order:

1. the T targets' **private look**: every client's private images of target j, pooled (what the attacks try to recover);
2. one **public look of target j** class per target that has public images in the insensitive look (the auxiliary
   domain D_a, e.g. the blurred digits): what an attacker knows without any leak;
3. one class per **non-target label** of the public set (both looks), and one class for the public images without a
   label (DS-FL's relabelled non-targets, a foreign public set), where there are any.

A reconstruction of target j is a hit only if classified as j's private look; top-5 ranks all those classes.
Public images of a target in the sensitive look (``data.split=random``: the public set is a sample of the same
pool) are left out of every class: they are that target's look, not a different one. Training weighs the classes
equally (the pooled public classes are larger than the private ones) and sees every image twice, once as it is and
once with Gaussian pixel noise of a standard deviation drawn from U(0, 0.6) (:data:`NOISE_MAX`): reconstructions are
noisy, and a classifier trained on clean images alone takes high-frequency noise for the sharp private look. On the
default run (``fdattack run``, seed 42), trained on clean images only, noise of std 0.6 moved 2 of the 5 targets'
public means into their private classes and TBI's saturated, noisy reconstructions (all 5 nearest their public means
by SSIM) scored eval top-1 0.80. With the noisy copies, over classifier seeds 0-2: public means 0/5 clean and noisy,
private means 5/5, TBI 0.00-0.20, PLI 0.00-0.40 (its SSIM attack accuracy 0.40), PLI's prior 0.80-1.00. With 5
targets one identity is 0.20: read these scores with their interval. ``eval_classifier_accuracy`` is the top-1 of
the targets' held-out test images over all the classes. Beside the scores, ``eval_top1_public_look`` scores the
per-target public means (every public image carrying the label, both looks, the public means of the attack
accuracy, Takahashi et al., CVPR 2023, §4.1) with the same classifier: what copying the public look earns (about 0 when the public look
differs from the private one; high under ``data.split=random``, where it does not).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from fdattack import lit, models
from fdattack.code_version import source_digest
from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import AUXILIARY, UNLABELED, ImageSet, IndexedBatch
from fdattack.engine import FitJob, LocalTrainer
from fdattack.evaluation.weights import require_finite
from fdattack.functional import topk_accuracy
from fdattack.functional.attack_accuracy import class_means
from fdattack.lit.classifier import ClassifierLitModule
from fdattack.models.classifiers import build_classifier
from fdattack.tracking.artifact_cache import ArtifactCache, digest

#: the largest standard deviation of the pixel noise of the training images' noisy copies (pixels in [-1, 1])
NOISE_MAX = 0.6
#: its entries in the cache: ``identity_classifier_<digest>.pt``
CACHE_KIND = "identity_classifier"


class IdentityScorer:
    """Top-1 / top-5 of reconstructions under an evaluation classifier whose first T outputs are the targets: the
    top-k identity accuracy of the GMI / KED-MI convention. PLI itself scores with SSIM only (Takahashi et al., §4.1); this second
    figure makes PLI comparable with later model-inversion attacks.

    A reconstruction of target j is a hit when j's output ranks first (top-5: among the first five) over *all* the
    classifier's outputs, the extra classes included.

    Args:
        predict: ``images (N, C, H, W) -> (N, K)`` logits, K >= T; outputs 0..T-1 stand for ``target_labels`` in
            that order (the targets' private looks), the others for anything else (public looks, other labels: the
            classes of the module docstring).
        target_labels: the labels the first T outputs stand for.
        test_accuracy: the classifier's own top-1 on held-out images (reported next to its scores).
        public_look: ``(images (P, C, H, W), labels (P,))``: the targets' public means, scored as
            ``eval_top1_public_look`` (what a copy of the public look earns) over the labels scored; None = not logged.
        class_names: a name per output (for messages and readers), or None.
        test_images: how many held-out images ``test_accuracy`` is over (0: not known).
    """

    def __init__(
        self,
        predict: Callable[[Tensor], Tensor],
        target_labels: list[int],
        test_accuracy: float,
        public_look: Optional[tuple[Tensor, Tensor]] = None,
        class_names: Optional[Sequence[str]] = None,
        test_images: int = 0,
    ) -> None:
        self.predict = predict
        self.test_images = test_images
        self.index = {label: i for i, label in enumerate(target_labels)}
        self.test_accuracy = test_accuracy
        self.public_look = public_look
        self.class_names = tuple(class_names) if class_names is not None else None
        self._public_hits: Optional[dict[int, float]] = None

    def _rows(self, labels: Tensor) -> Tensor:
        return torch.tensor([self.index[int(y)] for y in labels], dtype=torch.long)

    def public_look_hits(self) -> dict[int, float]:
        """Target label -> 1.0 if its public mean is classified as its private look, else 0.0 (computed once)."""
        if self._public_hits is None:
            self._public_hits = {}
            if self.public_look is not None and len(self.public_look[1]):
                images, labels = self.public_look
                top = self.predict(images).argmax(dim=1)
                self._public_hits = {int(y): float(t == r) for y, t, r in zip(labels, top, self._rows(labels))}
        return self._public_hits

    def __call__(self, recon: Tensor, labels: Tensor) -> dict[str, float]:
        logits = self.predict(recon)
        rows = self._rows(labels)
        out = {
            "eval_top1": topk_accuracy(logits, rows, 1),
            "eval_top5": topk_accuracy(logits, rows, 5),
            "eval_classifier_accuracy": self.test_accuracy,
        }
        hits = [self.public_look_hits()[int(y)] for y in labels if int(y) in self.public_look_hits()]
        if hits:
            out["eval_top1_public_look"] = sum(hits) / len(hits)
        return out


@dataclass(frozen=True)
class IdentityClasses:
    """The evaluation classifier's training set and what its classes stand for.

    Attributes:
        train: the images, labelled with class indices 0..K-1 (targets' private looks first, in ``targets`` order).
        names: K readable names (``private 3``, ``public look 3``, ``label 7``, ``unlabelled public``).
        targets: the T target labels.
    """

    train: ImageSet
    names: tuple[str, ...]
    targets: tuple[int, ...]


def identity_classes(split: FederatedSplit) -> IdentityClasses:
    """The classes of the evaluation classifier (see the module docstring) and their training images."""
    targets = [int(j) for j in split.target_labels]
    is_target = torch.zeros(split.num_classes + 1, dtype=torch.bool)
    is_target[torch.tensor(targets)] = True
    parts: list[tuple[str, Tensor]] = []
    private = torch.cat([p.images for p in split.private])
    private_labels = torch.cat([p.labels for p in split.private])
    parts += [(f"private {j}", private[private_labels == j]) for j in targets]
    public = split.public
    known = public.labels >= 0
    public_target = known & is_target[public.labels.clamp(min=0)]
    look = public_target & (public.domain == AUXILIARY)
    parts += [(f"public look {j}", public.images[look & (public.labels == j)]) for j in targets]
    parts += [
        (f"label {c}", public.images[known & ~public_target & (public.labels == c)])
        for c in sorted(set(public.labels[known & ~public_target].tolist()))
    ]
    parts.append(("unlabelled public", public.images[public.labels == UNLABELED]))
    parts = [(name, images) for i, (name, images) in enumerate(parts) if i < len(targets) or len(images)]  # no empty extra class
    images = torch.cat([x for _, x in parts])
    labels = torch.cat([torch.full((len(x),), i, dtype=torch.long) for i, (_, x) in enumerate(parts)])
    return IdentityClasses(ImageSet.from_images(images, labels), tuple(name for name, _ in parts), tuple(targets))


def with_noisy_copies(images: ImageSet, noise_max: float, seed: int) -> ImageSet:
    """``images`` followed by a copy of each with Gaussian noise of a std drawn from U(0, ``noise_max``) per image."""
    generator = torch.Generator().manual_seed(seed)
    x = images.images
    sigma = torch.rand(len(x), *([1] * (x.dim() - 1)), generator=generator) * noise_max
    noisy = x + torch.randn(x.shape, generator=generator) * sigma
    return ImageSet.from_images(torch.cat([x, noisy]), torch.cat([images.labels, images.labels]))


def balanced_cross_entropy(counts: Tensor):  # type: ignore[no-untyped-def]
    """Cross-entropy with class weights inversely proportional to ``counts`` (every class weighs the same in total)."""
    weight = torch.where(counts > 0, counts.sum() / (len(counts) * counts.clamp(min=1)), torch.zeros(()))

    def objective(logits: Tensor, batch: IndexedBatch) -> Tensor:
        return F.cross_entropy(logits, batch["y"], weight=weight.to(logits.device), ignore_index=UNLABELED)

    return objective


def public_look_means(split: FederatedSplit) -> tuple[Tensor, Tensor]:
    """(P, C, H, W) means of every public image carrying each target label that has any, and their (P,) labels."""
    targets = torch.tensor(split.target_labels)
    means = class_means(split.public.images, split.public.labels, split.num_classes)[targets]
    present = ~torch.isnan(means.flatten(1)).any(dim=1)
    return means[present], targets[present]


def train_identity_scorer(
    split: FederatedSplit,
    engine: LocalTrainer,
    architecture: str,
    epochs: int,
    lr: float,
    seed: int,
    cache: ArtifactCache | None = None,
    announce: Callable[[str], None] | None = None,
) -> IdentityScorer:
    """The evaluation classifier over the targets' private looks, their public looks and the non-target classes.

    Args:
        split: the ground truth.
        engine: trains and queries the classifier.
        architecture: a classifier registry name.
        epochs, lr: Adam training of the classifier.
        seed: its initialisation and batch order (the run's random stream is left alone).
        cache: where the trained network is kept and found again (named by a digest of all it depends on), or None.
        announce: told when the training starts (a progress bar's activity), or None.
    """
    classes = identity_classes(split)
    k = len(classes.names)
    remap = torch.full((split.num_classes + 1,), -1, dtype=torch.long)
    remap[torch.tensor(classes.targets)] = torch.arange(len(classes.targets))
    test = split.test.subset(torch.nonzero(remap[split.test.labels.clamp(min=0)] >= 0).flatten())
    c, size = split.image_shape[0], split.image_shape[-1]
    with torch.random.fork_rng(devices=[]):  # seeded initialisation that leaves the run's random stream alone
        torch.manual_seed(seed)
        module = ClassifierLitModule(build_classifier(architecture, c, size, k), k, lr=lr)
    handle = engine.setup("evaluation_classifier", module)

    def trained() -> dict:
        if announce is not None:
            announce(f"training the evaluation classifier ({architecture}, {epochs} epochs)")
        counts = torch.bincount(classes.train.labels, minlength=k).float()
        engine.fit(FitJob(handle, with_noisy_copies(classes.train, NOISE_MAX, seed), epochs, balanced_cross_entropy(counts), seed))
        require_finite(module.net, "the evaluation classifier", "evaluation.lr", lr)
        return {"net": module.net.state_dict()}

    if cache is None:
        trained()
    else:
        key = identity_key(architecture, epochs, lr, seed, classes, engine.recipe(), source_digest(train_identity_scorer, lit, models))
        module.net.load_state_dict(cache.fetch(CACHE_KIND, key, trained, check=_fits(module), writer=engine.is_global_zero)["net"])
    test_logits = engine.predict(handle, test.images)
    test_accuracy = topk_accuracy(test_logits, remap[test.labels], 1) if len(test) else float("nan")
    return IdentityScorer(
        lambda images: engine.predict(handle, images),
        list(classes.targets),
        test_accuracy,
        public_look=public_look_means(split),
        class_names=classes.names,
        test_images=len(test),
    )


def identity_key(architecture: str, epochs: int, lr: float, seed: int, classes: IdentityClasses, recipe: dict, code: str) -> str:
    """The cache key of the evaluation classifier: a digest of everything its training reads (the arguments of
    :func:`train_identity_scorer` that shape it, its classes whole (training rows, names, targets), the engine's
    :meth:`~fdattack.engine.LocalTrainer.recipe` and the training code's :func:`~fdattack.code_version.source_digest`)."""
    return digest(architecture, epochs, lr, seed, NOISE_MAX, classes, recipe, code)


def _fits(module: ClassifierLitModule) -> Callable[[dict], None]:
    """A check that a cached payload's network loads into ``module``'s (a copy, so a failed load leaves it alone)."""
    return lambda payload: copy.deepcopy(module.net).load_state_dict(payload["net"])
