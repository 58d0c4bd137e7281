"""Metrics of class-representative inversions (fedinverse.md §6, lattack.md §5.1): S samples for each of T target labels.

Every function takes the evaluation classifier's outputs (logits or penultimate features) laid out as the
inversions are, ``(S, T, ...)``: sample index s (a seed, a draw) first, target label t second.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def topk_per_sample(logits: Tensor, labels: Tensor, k: int) -> Tensor:
    """acc_s of §6.1: for every sample index s, the fraction of the T target labels whose sample the classifier
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
    """Mean and sample standard deviation (n − 1, ``statistics.stdev``) over sample indices, as §6.1 reports them
    (the std is NaN for one sample)."""
    std = float(values.std(unbiased=True)) if len(values) > 1 else float("nan")
    return float(values.mean()), std


def feature_diversity(groups: Sequence[Tensor]) -> float:
    """Mean pairwise Euclidean distance between the rows of each group, averaged over the groups.

    Applied to the S samples of each target label (``[features[:, t] for t in range(T)]``), it measures how
    different an attack's samples of one label look to the evaluation classifier: 0 when every sample of a
    label is the same image (mode collapse), larger as they spread. FedInverse adds its HSIC term to "adjust
    the diversity" of the samples (§5) and never measures it; this figure does. It is in the units of the
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


def knn_distance(features: Tensor, labels: Tensor, real_features: Tensor, real_labels: Tensor) -> float:
    """KNN-dist of §6.3: mean over the inversions of the squared distance to the nearest real image of their label.

    Args:
        features: (S, T, D) penultimate features of the inversions.
        labels: (T,) the target label of each column.
        real_features: (N, D) features of the real (private training) images.
        real_labels: (N,) their labels.

    Returns:
        The mean over the labels' inversions that have real images of their label; NaN if none has.
    """
    nearest = [torch.cdist(features[:, t].double(), real_features[real_labels == y].double()).min(dim=1).values.square()
               for t, y in enumerate(labels.tolist()) if bool((real_labels == y).any())]
    return float(torch.cat(nearest).mean()) if nearest else float("nan")


def centroid_cosine(samples: Tensor, real: Tensor, centre: Tensor) -> Tensor:
    """cos(x − μ, mean(real) − μ) for every row x of ``samples`` (lattack.md §5.1): how far each sample points from
    the centre μ towards the real images' centroid.

    Args:
        samples: (n, D) features; real: (m, D) features of real images; centre: (D,) μ (zeros: the uncentred cosine).

    Returns:
        (n,) cosines in [-1, 1] (0 where a vector is zero).
    """
    target = real.double().mean(dim=0) - centre.double()
    return F.cosine_similarity(samples.double() - centre.double(), target.unsqueeze(0), dim=-1)


def feature_cosine(generated: Tensor, real: Tensor, noise: Tensor) -> dict[str, float]:
    """Table II of the L-Attack paper for one target label (lattack.md §5.1, §8 item 14): the mean over the
    generated images of :func:`centroid_cosine` to the real images' centroid, and the same for uniform-noise
    images, the baseline (negative in the paper: -0.62 on MNIST against 0.96 for its generated digits).

    Centred on μ, the mean of the three groups' means: the mean over the union of equally many generated, real and
    noise images (the spec's n = 100 of each), whatever the number of real images, so that μ sits between the three
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
    centre = torch.stack([generated.double().mean(dim=0), real.double().mean(dim=0), noise.double().mean(dim=0)]).mean(dim=0)
    origin = torch.zeros_like(centre)
    return {
        "feature_cosine": float(centroid_cosine(generated, real, centre).mean()),
        "feature_cosine_noise": float(centroid_cosine(noise, real, centre).mean()),
        "feature_cosine_raw": float(centroid_cosine(generated, real, origin).mean()),
        "feature_cosine_noise_raw": float(centroid_cosine(noise, real, origin).mean()),
    }


def feature_cosines(features: Tensor, labels: Tensor, real_features: Tensor, real_labels: Tensor, noise_features: Tensor) -> dict[str, float]:
    """:func:`feature_cosine` of every target label, averaged over the labels.

    Args:
        features: (S, T, D) features of the inversions; noise_features: (S', T, D) of noise images, a column per label.
        labels: (T,) the target label of each column.
        real_features: (N, D) features of the real (private training) images; real_labels: (N,) their labels.

    Returns:
        The four means over the labels that have real images; NaN if none has.
    """
    per_label = [feature_cosine(features[:, t], real_features[real_labels == y], noise_features[:, t])
                 for t, y in enumerate(labels.tolist()) if bool((real_labels == y).any())]
    keys = ("feature_cosine", "feature_cosine_noise", "feature_cosine_raw", "feature_cosine_noise_raw")
    return {k: sum(v[k] for v in per_label) / len(per_label) if per_label else float("nan") for k in keys}


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
