"""Metrics of class-representative inversions (Wu et al., ICLR 2024, §4.4; Xiao et al., DSN 2024, §VI-A): S samples
for each of T target labels.

Every function takes the evaluation classifier's outputs (logits or penultimate features) laid out as the
inversions are, ``(S, T, ...)``: sample index s (a seed, a draw) first, target label t second.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def topk_per_sample(logits: Tensor, labels: Tensor, k: int) -> Tensor:
    """acc_s of Wu et al., ICLR 2024, §4.4: for every sample index s, the fraction of the T target labels whose sample the classifier
    ranks among its k highest logits (k is capped at the number of classes; a NaN logit never ranks high).

    Args:
        logits: (S, T, J) evaluation-classifier logits of the inversions.
        labels: (T,) the target label of each column.

    Returns:
        (S,) accuracy per sample index, in [0, 1].
    """
    logits = logits.float().masked_fill(torch.isnan(logits), float("-inf"))
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices  # (S, T, k)
    hits = (top == labels.long().view(1, -1, 1)).any(dim=-1)
    return hits.float().mean(dim=1)


def mean_and_std(values: Tensor) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1, ``statistics.stdev``) over sample indices, as FedInverse reports them
    (the std is NaN for one sample)."""
    std = float(values.std(unbiased=True)) if len(values) > 1 else float("nan")
    return float(values.mean()), std


def feature_diversity(groups: Sequence[Tensor]) -> float:
    """Mean pairwise Euclidean distance between the rows of each group, averaged over the groups.

    Applied to the S samples of each target label (``[features[:, t] for t in range(T)]``), it measures how
    different an attack's samples of one label look to the evaluation classifier: 0 when every sample of a
    label is the same image (mode collapse), larger as they spread. FedInverse adds its HSIC term to "adjust
    the diversity" of the samples (its §3.2) and never measures it; this figure does. It is in the units of the
    classifier's embedding, so it compares attacks scored by the same classifier (one run, or runs sharing
    ``evaluation.inversion``). Read it next to top-1 and beside the real images' own spread (the same figure
    over each label's private images): noise is diverse too.

    Args:
        groups: (n_g, D) features, one tensor per group (label).

    Returns:
        The mean over groups of two rows or more; NaN if there is none.
    """
    spreads = [torch.pdist(g.double()).mean() for g in groups if g.shape[0] > 1]
    return float(torch.stack(spreads).mean()) if spreads else float("nan")


def knn_distances(features: Tensor, labels: Tensor, real_features: Tensor, real_labels: Tensor) -> Tensor:
    """KNN-dist (the GMI literature's; FedInverse does not report it) per inversion: the squared distance to the nearest
    real image of its label.

    Args:
        features: (S, T, D) penultimate features of the inversions.
        labels: (T,) the target label of each column.
        real_features: (N, D) features of the real (private training) images.
        real_labels: (N,) their labels.

    Returns:
        (n,) float64, the inversions of the labels that have real images, column by column.
    """
    nearest = [
        torch.cdist(features[:, t].double(), real_features[real_labels == y].double()).min(dim=1).values.square()
        for t, y in enumerate(labels.tolist())
        if bool((real_labels == y).any())
    ]
    return torch.cat(nearest) if nearest else torch.empty(0, dtype=torch.float64)


def knn_distance(features: Tensor, labels: Tensor, real_features: Tensor, real_labels: Tensor) -> float:
    """KNN-dist: the mean of :func:`knn_distances`; NaN if no label has real images."""
    distances = knn_distances(features, labels, real_features, real_labels)
    return float(distances.mean()) if len(distances) else float("nan")


def centroid_cosine(samples: Tensor, real: Tensor, centre: Tensor) -> Tensor:
    """cos(x − μ, mean(real) − μ) for every row x of ``samples`` (Xiao et al., DSN 2024, §VI-A): how far each sample points from
    the centre μ towards the real images' centroid.

    Args:
        samples: (n, D) features; real: (m, D) features of real images; centre: (D,) μ (zeros: the uncentred cosine).

    Returns:
        (n,) cosines in [-1, 1] (0 where a vector is zero).
    """
    target = real.double().mean(dim=0) - centre.double()
    return F.cosine_similarity(samples.double() - centre.double(), target.unsqueeze(0), dim=-1)


def feature_cosine(generated: Tensor, real: Tensor, noise: Tensor) -> dict[str, float]:
    """Table II of the L-Attack paper for one target label (§VI-A; which VGG16 features, and the centring, are choices): the mean over the
    generated images of :func:`centroid_cosine` to the real images' centroid, and the same for uniform-noise
    images, the baseline (negative in the paper: -0.62 on MNIST against 0.96 for its generated digits).

    Centred on μ, the mean of the three groups' means: the mean over the union of equally many generated, real and
    noise images (100 of each by default), whatever the number of real images, so that μ sits between the three
    groups and a generated image like the real ones points towards their centroid while noise points away (with
    far more real images than generated ones a plain union mean would sit on the real centroid and make the score
    the cosine of a sample's deviation from it with a tiny vector). Uncentred (``_raw``), every cosine of
    non-negative or offset features is near 1.

    Args:
        generated: (n, D) features of the generated images; real: (m, D) of the label's real images;
            noise: (n', D) of the uniform-noise images.

    Returns:
        ``feature_cosine``, ``feature_cosine_noise``, ``feature_cosine_raw``, ``feature_cosine_noise_raw``.
    """
    one_label = torch.zeros(1, dtype=torch.long)
    return feature_cosines(generated.unsqueeze(1), one_label, real, one_label.expand(len(real)), noise.unsqueeze(1))


def feature_cosine_samples(
    features: Tensor, labels: Tensor, real_features: Tensor, real_labels: Tensor, noise_features: Tensor
) -> dict[str, Tensor]:
    """The per-image cosines behind :func:`feature_cosine`, for every target label, pooled over the labels.

    Args:
        features: (S, T, D) features of the inversions; noise_features: (S', T, D) of noise images, a column per label.
        labels: (T,) the target label of each column.
        real_features: (N, D) features of the real (private training) images; real_labels: (N,) their labels.

    Returns:
        ``feature_cosine`` and ``feature_cosine_raw``: (S·T',) one cosine per inversion; ``feature_cosine_noise`` and
        ``feature_cosine_noise_raw``: (S'·T',) one per noise image; T' the labels that have real images.
    """
    pooled: dict[str, list[Tensor]] = {
        key: [] for key in ("feature_cosine", "feature_cosine_noise", "feature_cosine_raw", "feature_cosine_noise_raw")
    }
    for t, y in enumerate(labels.tolist()):
        real = real_features[real_labels == y]
        if not len(real):
            continue
        generated, noise = features[:, t], noise_features[:, t]
        centre = torch.stack([generated.double().mean(dim=0), real.double().mean(dim=0), noise.double().mean(dim=0)]).mean(dim=0)
        origin = torch.zeros_like(centre)
        pooled["feature_cosine"].append(centroid_cosine(generated, real, centre))
        pooled["feature_cosine_noise"].append(centroid_cosine(noise, real, centre))
        pooled["feature_cosine_raw"].append(centroid_cosine(generated, real, origin))
        pooled["feature_cosine_noise_raw"].append(centroid_cosine(noise, real, origin))
    return {key: torch.cat(values) if values else torch.empty(0, dtype=torch.float64) for key, values in pooled.items()}


def feature_cosines(
    features: Tensor, labels: Tensor, real_features: Tensor, real_labels: Tensor, noise_features: Tensor
) -> dict[str, float]:
    """:func:`feature_cosine` of every target label, averaged over the labels (every label has S inversions, so this
    is the mean of :func:`feature_cosine_samples`).

    Returns:
        The four means over the labels that have real images; NaN if none has.
    """
    samples = feature_cosine_samples(features, labels, real_features, real_labels, noise_features)
    return {key: float(values.mean()) if len(values) else float("nan") for key, values in samples.items()}


def inversion_grid(images: Tensor, samples: int) -> Tensor:
    """A grid with a row per target label and a column per sample (the first ``samples``), tiles side by side.

    Args:
        images: (S, T, C, H, W) in [-1, 1].

    Returns:
        (C, T·H, min(S, samples)·W) in [0, 1].
    """
    shown = images[:samples]
    rows = [torch.cat(list(shown[:, t]), dim=-1) for t in range(images.shape[1])]
    return (torch.cat(rows, dim=-2).float() * 0.5 + 0.5).clamp(0, 1)
