"""The evaluation classifier of model-inversion attacks (Wu et al., ICLR 2024, §4.4): trained apart from every federated
model on every class of the dataset, so that an inversion that reproduces one of the attacker's own (auxiliary)
classes is classified as that class, a miss.

It learns every client's private images and the attacker's auxiliary images. Its test accuracy is measured on the
run's test set, plus, for the classes that have no test image (the auxiliary classes of ``data.split=classes``), a
seeded :data:`HOLDOUT_FRACTION` of their images held out of its training. It trains once per run, when the first
inversions are scored (after the run directory is laid out), and is kept as
``artifacts/inversion_classifier_<digest>.<mode>.pt`` (the digest covers its settings and training data, the mode is the
run's ``isolation.mode``; under ``<cache_dir>/evaluation`` where the run names a shared cache,
:mod:`fdattack.tracking.artifact_cache`), which a resumed run, or any run with the same inputs there, loads instead of
training again (an isolated run reads only an isolated run's).
``evaluation.inversion.checkpoint`` names such a file (or a plain ``state_dict`` of the network) to use instead.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn

from fdattack import lit, models
from fdattack.code_version import source_digest
from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import ImageSet
from fdattack.engine import LocalTrainer, ModelHandle, predict_logits
from fdattack.evaluation.weights import load_weights, read_state_dict, require_finite
from fdattack.functional import topk_accuracy
from fdattack.knobs import knob
from fdattack.lit.classifier import ClassifierLitModule
from fdattack.models.classifiers import build_classifier
from fdattack.tracking.artifact_cache import ArtifactCache, digest


@dataclass
class InversionEvaluationSettings:
    classifier: str = knob(
        "scnn",
        "evaluation classifier of model-inversion attacks (their top-1/top-5, diversity and FID): a classifier registry name, trained "
        "apart from the federated models on every class of the dataset (every client's private images and the attacker's auxiliary "
        "classes), once per run, and kept in the run directory's artifacts/ (reused on resume)",
    )
    epochs: int = knob(10, "its training epochs", ge=1)
    lr: float = knob(1e-3, "its Adam learning rate", gt=0)
    batch_size: int = knob(32, "its mini-batch size", ge=1)
    checkpoint: Optional[str] = knob(
        None,
        "a trained evaluation classifier to use instead of training one: an earlier run's artifacts/inversion_classifier_*.pt or a "
        "state_dict of the network evaluation.inversion.classifier builds; null = train it",
    )
    grid_samples: int = knob(8, "samples of each target label shown in the inversion grid (its columns)", ge=1)
    inception_weights: Optional[str] = knob(
        None,
        "torchvision's Inception-v3 state_dict on disk (e.g. inception_v3_google-0cc3c7bd.pth) for an extra fid_inception in its 2048-d "
        "pool features (slow on a CPU: every private image of the targets goes through it once); never downloaded; null = none",
    )


log = logging.getLogger("fdattack")

#: share of a class's images held out for the test accuracy where the test set has none of that class
HOLDOUT_FRACTION = 0.1
CHECKPOINT_KEY = "evaluation.inversion.checkpoint"
#: its entries in the cache: ``inversion_classifier_<digest>.pt``
CACHE_KIND = "inversion_classifier"
#: the activation modules whose input :meth:`EvaluationClassifier.embed` takes as the pre-activation features
ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Hardswish)


@dataclass(frozen=True)
class EvaluationClassifier:
    """A trained all-class classifier: logits and penultimate features of images, and its held-out accuracy.

    Attributes:
        net: the network (on ``device``); its last linear layer is the head.
        device: where it runs.
        test_accuracy: top-1 on its held-out images (FedInverse's are about 98 %).
        test_images: how many images that accuracy is over.
        batch_size: rows per inference pass.
    """

    net: nn.Module
    device: torch.device
    test_accuracy: float
    test_images: int
    batch_size: int = 512

    @property
    def head(self) -> nn.Linear:
        """The last linear layer: its input is the penultimate embedding."""
        return [m for m in self.net.modules() if isinstance(m, nn.Linear)][-1]

    @property
    def num_classes(self) -> int:
        """J, its outputs."""
        return self.head.out_features

    def logits(self, images: Tensor) -> Tensor:
        """(N, J) logits on the CPU of (N, C, H, W) images in [-1, 1]."""
        return predict_logits(self.net, images, self.device, self.batch_size)

    def features(self, images: Tensor) -> Tensor:
        """(N, D) penultimate features on the CPU (the head's input, flattened) of (N, C, H, W) images."""
        return self.embed(images)[0]

    def embed(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Penultimate and pre-activation features on the CPU of (N, C, H, W) images, in one pass.

        The pre-activation features are the input of the last activation module (ReLU, LeakyReLU, ...) run before
        the head, averaged over its spatial positions: for SCNN the 512 channels of its last convolution before the
        LeakyReLU, for ``pdafd_cnn`` its last 128 before the ReLU and the pool (the L-Attack's pre-ReLU,
        global-average-pooled conv5_3 of VGG16, Xiao et al., DSN 2024, §VI-A). Unlike post-ReLU features they can point
        anywhere, so a cosine can be negative. A network without activation modules gives the head's input.

        Returns:
            (N, D) penultimate features and (N, D') pre-activation features.
        """
        penultimate: list[Tensor] = []
        pre: list[Tensor] = []
        last: list[Tensor] = []

        def pooled(x: Tensor) -> Tensor:  # a copy: in-place activations (ResNet's, MobileNet's) overwrite their input
            return x.detach().flatten(2).mean(dim=-1) if x.ndim > 2 else x.detach().clone()

        def on_activation(_: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            last[:] = [pooled(inputs[0])]

        def on_head(_: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            penultimate.append(inputs[0].flatten(1).float().cpu())
            pre.append((last[0] if last else pooled(inputs[0])).float().cpu())
            last.clear()

        hooks = [m.register_forward_pre_hook(on_activation) for m in self.net.modules() if isinstance(m, ACTIVATIONS)]
        hooks.append(self.head.register_forward_pre_hook(on_head))
        try:
            self.logits(images)
        finally:
            for hook in hooks:
                hook.remove()
        if not penultimate:
            return torch.empty(0, self.head.in_features), torch.empty(0, 0)
        return torch.cat(penultimate), torch.cat(pre)


def training_sets(split: FederatedSplit, seed: int) -> tuple[ImageSet, ImageSet]:
    """(train, test) of the evaluation classifier: every client's private images and the attacker's prior images
    (unlabeled rows left out); the test set, and :data:`HOLDOUT_FRACTION` of each class the test set lacks."""
    pool = [*split.private, *([split.attacker] if split.attacker is not None else [])]
    images, labels = torch.cat([p.images for p in pool]), torch.cat([p.labels for p in pool])
    rows = torch.nonzero(labels >= 0).flatten()
    test = split.test.subset(torch.nonzero(split.test.labels >= 0).flatten())
    rng = np.random.default_rng(seed)
    held: list[Tensor] = []
    for label in labels[rows].unique().tolist():
        if not bool((test.labels == label).any()):
            of_label = rows[labels[rows] == label].numpy()
            held.append(torch.as_tensor(rng.permutation(of_label)[: int(len(of_label) * HOLDOUT_FRACTION)], dtype=torch.long))
    held_rows = torch.cat(held) if held else torch.empty(0, dtype=torch.long)
    train_rows = rows[~torch.isin(rows, held_rows)]
    train = ImageSet.from_images(images[train_rows], labels[train_rows])
    test = ImageSet.from_images(torch.cat([test.images, images[held_rows]]), torch.cat([test.labels, labels[held_rows]]))
    return train, test


def inversion_classifier(
    split: FederatedSplit,
    engine: LocalTrainer,
    settings: InversionEvaluationSettings,
    seed: int,
    cache: ArtifactCache | None,
    announce: Callable[[str], None] | None = None,
) -> Callable[[], EvaluationClassifier]:
    """The evaluation classifier, as a call that builds it once: from ``settings.checkpoint`` (loaded and checked
    now, so that a bad file stops the run before its first round), else from ``cache``, else trained at the first call
    and cached there (written by the first rank; an unreadable entry is trained again; ``cache`` None keeps it in
    memory).

    Raises:
        ConfigError: the checkpoint is missing, unreadable, or does not fit the network (named by its key).
    """
    train, test = training_sets(split, seed)
    c, size = split.image_shape[0], split.image_shape[-1]
    # every label of the dataset: with data.label_space=targets the models output the private classes only
    num_classes = max(split.num_classes, int(train.labels.max()) + 1)

    def network() -> nn.Module:
        with torch.random.fork_rng(devices=[]):  # seeded initialisation that leaves the run's random stream alone
            torch.manual_seed(seed)
            return build_classifier(settings.classifier, c, size, num_classes)

    def build(net: nn.Module) -> ModelHandle:
        return engine.setup("inversion_classifier", ClassifierLitModule(net, num_classes, lr=settings.lr))

    if settings.checkpoint is not None:
        state = read_state_dict(
            settings.checkpoint,
            CHECKPOINT_KEY,
            "an earlier run's artifacts/inversion_classifier_*.pt or a saved state_dict of the network, or null to train the classifier",
        )
        net = network()
        load_weights(
            net,
            state,
            CHECKPOINT_KEY,
            settings.checkpoint,
            f"classifier {settings.classifier!r} with {num_classes} outputs for {c}x{size}x{size} images",
        )
        loaded = _scored(build(net), engine, test)
        return lambda: loaded
    key = inversion_classifier_key(
        settings, seed, split.image_shape, train, num_classes, engine.recipe(), source_digest(inversion_classifier, lit, models)
    )

    def trained() -> dict:
        if announce is not None:
            announce(f"training the inversions' evaluation classifier ({settings.classifier}, {settings.epochs} epochs)")
        handle = build(network())
        engine.fit_module(handle, train, settings.epochs, seed, batch_size=settings.batch_size)
        require_finite(handle.module.net, "the inversions' evaluation classifier", "evaluation.inversion.lr", settings.lr)  # type: ignore[union-attr]
        return {"net": handle.module.net.state_dict(), "classifier": settings.classifier}  # type: ignore[union-attr]

    @functools.cache
    def obtain() -> EvaluationClassifier:
        payload = (
            trained()
            if cache is None
            else cache.fetch(CACHE_KIND, key, trained, check=lambda p: network().load_state_dict(p["net"]), writer=engine.is_global_zero)
        )
        net = network()
        net.load_state_dict(payload["net"])
        scored = _scored(build(net), engine, test)
        log.info(
            "inversion evaluation classifier %s: test accuracy %.4f on %d held-out images",
            settings.classifier,
            scored.test_accuracy,
            scored.test_images,
        )
        return scored

    return obtain


def _scored(handle: ModelHandle, engine: LocalTrainer, test: ImageSet) -> EvaluationClassifier:
    """The handle's network as an :class:`EvaluationClassifier`, with its top-1 on ``test`` (NaN without test images)."""
    net, device, batch_size = handle.module.net, engine.fabric.device, engine.predict_batch_size  # type: ignore[union-attr]
    accuracy = topk_accuracy(predict_logits(net, test.images, device, batch_size), test.labels, 1) if len(test) else float("nan")
    return EvaluationClassifier(net, device, accuracy, len(test), batch_size)  # type: ignore[arg-type]


def inversion_classifier_key(
    settings: InversionEvaluationSettings, seed: int, image_shape: tuple, train: ImageSet, num_classes: int, recipe: dict, code: str
) -> str:
    """The cache key of the inversions' evaluation classifier: a digest of everything its training reads (its settings
    whole, seed, image shape, classes and training rows, the engine's :meth:`~fdattack.engine.LocalTrainer.recipe` and
    the training code's :func:`~fdattack.code_version.source_digest`)."""
    return digest(settings, seed, tuple(image_shape), num_classes, train.images, train.labels, recipe, code)
