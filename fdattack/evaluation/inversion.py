"""Scoring of :class:`~fdattack.fd.results.Inversions` (Wu et al., ICLR 2024, §4.4; Xiao et al., DSN 2024, §VI-A)
with the all-class evaluation classifier.

Metrics, under ``attack/<name>/``:

* ``top1``, ``top1_std``, ``top5``, ``top5_std``: for every sample index s, acc_s = hits over the T target labels / T;
  the mean over s and the sample std (n − 1), as FedInverse reports them.
* ``chance``: 1/T, the top-1 of a guess among the T attacked labels (the issue's "chance (1/5)"); with one attacked
  label (the L-Attack's c*) 1/J, the top-1 of images the classifier names at random among its J classes; ``chance_top5``:
  min(5, J)/J, the top-5 of images the classifier ranks at random among its J classes (top-5 of 10 digits is 0.5,
  which is why FedInverse's MNIST Acc5 is near 100 %).
* ``diversity``: :func:`~fdattack.functional.inversion_metrics.feature_diversity` of each label's S samples;
  ``diversity_real``: the same figure over the labels' private images, its scale.
* ``fid``: the Fréchet distance in the classifier's penultimate features (torchmetrics'
  ``FrechetInceptionDistance`` with the classifier as feature extractor; no Inception network) between all S·T
  inversions and the private training images of the attacked labels (FedInverse's §4.4). With fewer images than feature
  dimensions the covariance of the inversions is rank-deficient and FID depends on their number, logged
  beside it as ``fid_images``: compare FIDs of equal ``fid_images`` only, never across attacks of different S·T.
* ``fid_inception``: the same Fréchet distance in Inception-v3's pool features, only where
  ``evaluation.inversion.inception_weights`` names the weights on disk (see :mod:`fdattack.evaluation.inception`).
* ``knn_dist``: mean squared feature distance of each inversion to the nearest private image of its label (the GMI literature's KNN-dist).
* ``feature_cosine``, ``feature_cosine_noise``, ``feature_cosine_raw``, ``feature_cosine_noise_raw``: the L-Attack's
  similarity (Xiao et al., §VI-A, Table II; :func:`~fdattack.functional.inversion_metrics.feature_cosine`): per target label, the
  mean over its inversions of cos(f(x) − μ, mean f(real) − μ) to the centroid of the label's private images, μ the
  mean of three means: the inversions', the real images' and as many seeded uniform-noise images' features; the same
  for the noise images (the baseline, negative in the paper); both uncentred (``_raw``); averaged over the labels. f
  is the classifier's pre-activation features (:meth:`~fdattack.evaluation.inversion_classifier.EvaluationClassifier.embed`),
  not the paper's ImageNet-pretrained VGG16 (pre-ReLU conv5_3): no pretrained network is downloaded, so the absolute
  values differ from the paper's and only generated ≫ noise is comparable.
* ``eval_classifier_accuracy``: the classifier's own held-out top-1 (FedInverse's are about 98 %); and the attack's ``details`` as they are.
* 95 % intervals (``<metric>_ci_low`` / ``_ci_high``, :mod:`fdattack.statistics.intervals`). The independent unit is the
  target label: a label's S inversions share its latent search (GMI's restarts share the label's difficulty, KED-MI's
  and VMI's S images are draws from the label's one learnt distribution), so they are no S independent trials. Each
  of ``top1``, ``top5``, ``knn_dist``, ``diversity``, ``diversity_real`` and the four feature cosines is a mean over
  the labels of a per-label value, and takes :func:`~fdattack.statistics.intervals.mean_interval` over the labels on
  its kind's scale; with one label (the L-Attack's c*, one generator) there is none (NaN): the seeds are its interval.
  ``fid`` (and ``fid_inception``) compares the pooled inversions of the fixed set of labels with their private
  images: its interval comes from the standard error of the stratified bootstrap of the draws, each label's S
  inversions resampled apart, the private images fixed (each replicate by
  :class:`~fdattack.functional.frechet.FrechetToReference`), on the log scale
  (:func:`~fdattack.statistics.intervals.positive_bootstrap_interval`): the Monte-Carlo error of S draws per label,
  not the attack's run-to-run spread. ``eval_classifier_accuracy``: Wilson
  over the classifier's held-out images. ``top1_std``, ``top5_std`` (a spread), ``chance``, ``chance_top5`` and
  ``fid_images`` (fixed by the settings) carry none, nor do the attack's ``details`` (``target_top1``: the attack's
  own convergence check, one number it computes; across seeds every metric has its interval).

The grid (a row per target label, a column per sample) is logged as ``attack/<name>/inversions``; the images
and labels are saved as the ``<name>_inversions`` artifact (images as uint8, as PNGs would hold them).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import Tensor, nn
from torchmetrics.image.fid import FrechetInceptionDistance

from fdattack.data.federated import FederatedSplit
from fdattack.engine import LocalTrainer
from fdattack.evaluation.inception import load_inception
from fdattack.evaluation.inversion_classifier import EvaluationClassifier, InversionEvaluationSettings, inversion_classifier
from fdattack.evaluation.report import Report
from fdattack.evaluation.scoring import SCORERS, ScoringContext, check_labels
from fdattack.fd.results import Inversions
from fdattack.functional.frechet import FrechetToReference
from fdattack.functional.inversion_metrics import (
    feature_cosine_samples,
    feature_diversity,
    inversion_grid,
    knn_distances,
    mean_and_std,
    topk_per_sample,
)
from fdattack.randomness import derive_seed
from fdattack.statistics.intervals import (
    NO_INTERVAL,
    TRIALS,
    interval_keys,
    mean_interval,
    positive_bootstrap_interval,
    wilson_interval_of_rate,
)
from fdattack.tracking.artifact_cache import ArtifactCache

#: private images per label over which ``diversity_real`` is measured (the first ones)
REAL_DIVERSITY_IMAGES = 1000
#: seed of the uniform-noise images of ``feature_cosine_noise`` (the same noise every round)
NOISE_SEED = 0


def _with_interval(key: str, value: float, interval: tuple[float, float]) -> dict[str, float]:
    return {key: value, **interval_keys(key, interval)}


def _interval_over_labels(key: str, per_label: Tensor, samples: int | None = None) -> dict[str, float]:
    """The interval keys of ``key``, a mean over target labels of ``per_label`` (T,) values: the labels are the units
    (:func:`~fdattack.statistics.intervals.mean_interval`; NaN with one label). A rate of hits over ``samples`` draws
    per label counts them as its trials (never narrower than Wilson over all T · S draws; ``key_trials``)."""
    if samples is None:
        return interval_keys(key, mean_interval(key, per_label.double().numpy()))
    trials = [float(samples)] * len(per_label)
    return {**interval_keys(key, mean_interval(key, per_label.double().numpy(), trials=trials)), key + TRIALS: float(sum(trials))}


class GivenFeatures(nn.Module):
    """The identity, as torchmetrics' FID feature extractor over features computed beforehand (once per image, not once
    per bootstrap resample)."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features

    def forward(self, features: Tensor) -> Tensor:
        return features


class PenultimateFeatures(nn.Module):
    """The evaluation classifier's penultimate features as torchmetrics' FID feature extractor.

    ``num_features`` tells torchmetrics the dimension, so that it never probes the network with an Inception-sized
    3×299×299 image.
    """

    def __init__(self, classifier: EvaluationClassifier) -> None:
        super().__init__()
        self.classifier = classifier
        self.num_features = classifier.head.in_features

    def forward(self, images: Tensor) -> Tensor:
        return self.classifier.features(images)


class InversionScorer:
    """Scores inversions against the private images of their labels.

    Args:
        split: the ground truth (every client's private images).
        classifier: returns the evaluation classifier (built at the first call, see
            :func:`~fdattack.evaluation.inversion_classifier.inversion_classifier`).
        grid_samples: columns of the grid (samples shown per label).
        inception: Inception-v3 features for ``fid_inception`` (None: not logged).
    """

    def __init__(
        self, split: FederatedSplit, classifier: Callable[[], EvaluationClassifier], grid_samples: int, inception: nn.Module | None = None
    ) -> None:
        self.real_images = torch.cat([p.images for p in split.private])
        self.real_labels = torch.cat([p.labels for p in split.private])
        self.classifier = classifier
        self.grid_samples = grid_samples
        self.inception = inception
        self.target_labels = tuple(int(j) for j in split.target_labels)
        self._real_features: tuple[Tensor, Tensor] | None = None
        self._fid: dict[tuple[str, tuple[int, ...]], tuple[FrechetInceptionDistance, FrechetToReference | None]] = {}

    def real_features(self) -> tuple[Tensor, Tensor]:
        """(N, D) penultimate and (N, D') pre-activation features of every private image (computed once)."""
        if self._real_features is None:
            self._real_features = self.classifier().embed(self.real_images)
        return self._real_features

    def _fid_metric(self, labels: Tensor, extractor: nn.Module) -> tuple[FrechetInceptionDistance, FrechetToReference | None]:
        """The Fréchet distance over features holding those of the private images of ``labels`` under ``extractor``,
        and the same reference for the bootstrap (None with fewer than two images); kept per extractor and label set."""
        key = (type(extractor).__name__, tuple(sorted(set(labels.tolist()))))
        if key not in self._fid:
            real = self.real_images[torch.isin(self.real_labels, torch.tensor(key[1]))]
            metric = FrechetInceptionDistance(feature=GivenFeatures(extractor.num_features), reset_real_features=False)
            real_features = extractor(real) if len(real) else None
            if real_features is not None:
                metric.update(real_features, real=True)
            self._fid[key] = (metric, FrechetToReference(real_features) if len(real) >= 2 else None)
        return self._fid[key]

    def fid(self, images: Tensor, labels: Tensor, extractor: nn.Module) -> tuple[float, tuple[float, float]]:
        """FID in ``extractor``'s features between ``images`` (S, T, C, H, W), the S inversions of each of the T ``labels``,
        and the private images of ``labels`` (torchmetrics), and its interval from the stratified bootstrap's standard
        error (:func:`~fdattack.statistics.intervals.positive_bootstrap_interval`): each label's S inversions resampled
        apart, the private images fixed (:class:`~fdattack.functional.frechet.FrechetToReference`); NaN with fewer than
        two images on a side."""
        metric, reference = self._fid_metric(labels, extractor)
        s, t = images.shape[:2]
        if s * t < 2 or reference is None:
            return float("nan"), NO_INTERVAL
        features = extractor(images.reshape(s * t, *images.shape[2:]))  # row i·T + j: sample i of label j
        metric.reset()
        metric.update(features, real=False)
        value = float(metric.compute())
        distance = reference.of_rows(features)
        strata = [np.arange(j, s * t, t) for j in range(t)]
        return value, positive_bootstrap_interval(strata, lambda *rows: distance(torch.as_tensor(np.concatenate(rows))))

    def __call__(self, attack: str, result: Inversions) -> Report:
        """``attack/<name>/...`` metrics, the grid and the artifact of one attack's inversions this round; refuses labels
        that are not distinct target labels (:func:`~fdattack.evaluation.scoring.check_labels`)."""
        check_labels(attack, result, self.target_labels)
        return self.measure(attack, result)

    def measure(self, attack: str, result: Inversions) -> Report:
        """The report of :meth:`__call__`, the labels taken as they are."""
        name = result.name or attack
        classifier = self.classifier()
        s, t = result.images.shape[:2]
        flat = result.images.reshape(s * t, *result.images.shape[2:])
        logits = classifier.logits(flat).view(s, t, -1)
        features, pre = (f.view(s, t, -1) for f in classifier.embed(flat))
        noise = torch.rand(flat.shape, generator=torch.Generator().manual_seed(NOISE_SEED)) * 2 - 1  # the pixel range [-1, 1]
        noise_pre = classifier.embed(noise)[1].view(s, t, -1)
        (real, real_pre), labels = self.real_features(), result.labels
        values = dict(result.details)  # the scores below win over a detail of the same name
        for k in (1, 5):
            hits = torch.stack([topk_per_sample(logits[:, [j]], labels[[j]], k) for j in range(t)], dim=1)  # (S, T)
            values[f"top{k}"], values[f"top{k}_std"] = mean_and_std(hits.mean(dim=1))
            values.update(_interval_over_labels(f"top{k}", hits.mean(dim=0), samples=s))
        distances = knn_distances(features, labels, real, self.real_labels)  # S per label with private images, label by label
        cosines = feature_cosine_samples(pre, labels, real_pre, self.real_labels, noise_pre)
        extractor = PenultimateFeatures(classifier)
        spreads = torch.tensor([feature_diversity([features[:, j]]) for j in range(t)])
        real_spreads = torch.tensor([feature_diversity([real[self.real_labels == y][:REAL_DIVERSITY_IMAGES]]) for y in labels.tolist()])
        values.update(
            {
                "chance": 1.0 / (t if t > 1 else classifier.num_classes),
                "chance_top5": min(5, classifier.num_classes) / classifier.num_classes,
                "diversity": float(spreads.nanmean()),
                **_interval_over_labels("diversity", spreads),
                "diversity_real": float(real_spreads.nanmean()),
                **_interval_over_labels("diversity_real", real_spreads),
                **_with_interval("fid", *self.fid(result.images, labels, extractor)),
                "fid_images": float(s * t),
                "knn_dist": float(distances.mean()) if len(distances) else float("nan"),
                **_interval_over_labels("knn_dist", distances.view(-1, s).mean(dim=1)),
                "eval_classifier_accuracy": classifier.test_accuracy,
                **interval_keys("eval_classifier_accuracy", wilson_interval_of_rate(classifier.test_accuracy, classifier.test_images)),
            }
        )
        for key, per_image in cosines.items():
            values[key] = float(per_image.mean()) if len(per_image) else float("nan")
            values.update(_interval_over_labels(key, per_image.view(-1, s).mean(dim=1)))
        if self.inception is not None:
            values.update(_with_interval("fid_inception", *self.fid(result.images, labels, self.inception)))
        as_bytes = ((result.images.float() * 0.5 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
        return Report(
            metrics={f"attack/{name}/{key}": float(value) for key, value in values.items()},
            images={f"attack/{name}/inversions": inversion_grid(result.images, self.grid_samples)},
            artifacts={f"{name}_inversions": {"images": as_bytes, "labels": labels}},
        )


def inversion_scorer(
    split: FederatedSplit,
    engine: LocalTrainer,
    settings: InversionEvaluationSettings,
    seed: int,
    cache: ArtifactCache | None,
    announce: Callable[[str], None] | None = None,
) -> InversionScorer:
    """The scorer of a run's inversions with its evaluation classifier (trained at the first score and kept in
    ``cache``, see :func:`~fdattack.evaluation.inversion_classifier.inversion_classifier`) and, where
    ``settings.inception_weights`` names them, Inception-v3 for ``fid_inception``.

    Raises:
        ConfigError: ``settings.checkpoint`` or ``settings.inception_weights`` is missing or does not fit.
    """
    classifier = inversion_classifier(split, engine, settings, seed, cache, announce)
    inception = load_inception(settings.inception_weights, engine.fabric.device) if settings.inception_weights is not None else None
    return InversionScorer(split, classifier, settings.grid_samples, inception)


@SCORERS.register(Inversions)
def build_inversion_scorer(context: ScoringContext) -> InversionScorer:
    """:func:`inversion_scorer` with the run's ``evaluation.inversion`` settings, its classifier seeded from the run seed."""
    settings = OmegaConf.to_object(context.cfg.evaluation.inversion)
    return inversion_scorer(
        context.oracle.split,
        context.oracle.engine,
        settings,  # type: ignore[arg-type]
        derive_seed(context.cfg.seed, "inversion_classifier"),
        context.cache,
        context.announce,
    )
