"""The kind of every metric fdattack logs, the one table that picks its interval's scale
(:func:`fdattack.statistics.intervals.mean_interval`), within a run and across seeds.

* ``rate``: a proportion in [0, 1] (accuracy, top-k, AUC, TPR, balanced accuracy, test accuracy), or a mean of values
  bounded by [0, 1] (the Chebyshev and total-variation distances between two label distributions);
* ``positive``: a non-negative quantity (distances, KL, FID, spreads, times, bytes, counts);
* ``signed``: anything else (SSIM and cosines in [-1, 1], losses, differences), also every name not in this table.

A key is looked up by its last part (``attack/pli/accuracy`` -> ``accuracy``), with the ``prior_`` and ``paper_``
prefixes of a figure's variants removed (``prior_eval_top1`` is a rate like ``eval_top1``).
"""

from __future__ import annotations

import math
from enum import Enum


class MetricKind(str, Enum):
    """The range of a metric, which sets the scale of its interval."""

    rate = "rate"
    positive = "positive"
    signed = "signed"


#: proportions in [0, 1]
RATES = frozenset(
    {
        # reconstructions (Takahashi et al., CVPR 2023, §4.1) and their evaluation classifier
        "accuracy",
        "eval_top1",
        "eval_top5",
        "eval_top1_public_look",
        "eval_classifier_accuracy",
        "chance",
        # inversions (Wu et al., ICLR 2024, §4.4)
        "top1",
        "top5",
        "chance_top5",
        "target_top1",
        "selection_score",
        # membership (Shi et al., PoPETs 2025, §4.1.4)
        "tpr_at_1pct_fpr",
        "tpr_at_0.1pct_fpr",
        "auc",
        "balanced_accuracy",
        "withheld_fraction",
        # label distributions (Shi et al., PoPETs 2025, §4.1.3): distances between two distributions, within [0, 1]
        "chebyshev",
        "tv",
        "random_chebyshev",
        "random_chebyshev_mean1000",
        "uniform_chebyshev",
        # the protocol's utility
        "client_acc_mean",
        "client_acc_min",
        "client_acc_max",
        "client_acc_own_mean",
        "client_acc_own_min",
        "client_acc_own_max",
        "server_acc",
        "fedgems_pool_fraction",
    }
)

#: non-negative quantities
POSITIVE = frozenset(
    {
        # label distributions (Shi et al., PoPETs 2025, §4.1.3) and their baselines
        "kl",
        "kl_eq7",
        "l1",
        "random_kl",
        "random_kl_mean1000",
        "uniform_kl",
        # inversions (Wu et al., ICLR 2024, §4.4; KNN-dist from the GMI literature) and spreads
        "fid",
        "fid_inception",
        "fid_images",
        "knn_dist",
        "diversity",
        "diversity_real",
        "top1_std",
        "top5_std",
        "grad_cosine_std",
        # counts
        "too_close_to_public",
        "clients_scored",
        "references_mean",
        "fallback_clients",
        "steps",
        "queries_total",
        "miner_epochs",
        "added_samples",
        "queries",
        "query_bytes",
        "query_samples",
        "sent_aggregates",
        "withheld_rows",
        "unanswered_rows",
        "dropped_uploads",
        "cronus_filtered",
        # cost and privacy budget
        "upload_bytes",
        "download_bytes",
        "round_s",
        "total_s",
        "overlap_s",
        "wall_s",  # the benchmarks' (benchmarks/peers)
        "peak_rss_mib",
        "epsilon",
        "epsilon_mean",
        # entropies of the confidence-gap diagnostic
        "client_public_mean",
        "client_private_mean",
        "server_public_mean",
        "server_private_mean",
    }
)

#: signed quantities bounded by [−1, 1]: the SSIMs and the cosines of features or gradients
UNIT_SIGNED = frozenset(
    {
        "ssim",
        "ssim_standard",
        "grad_cosine",
        "feature_cosine",
        "feature_cosine_noise",
        "feature_cosine_raw",
        "feature_cosine_noise_raw",
    }
)

#: prefixes of a figure's variants, which keep its kind
VARIANT_PREFIXES = ("prior_", "paper_")


def metric_kind(key: str) -> MetricKind:
    """The kind of the metric ``key`` (a full key such as ``attack/pli/accuracy`` or its last part)."""
    name = key.rsplit("/", 1)[-1]
    for prefix in VARIANT_PREFIXES:
        name = name.removeprefix(prefix)
    if name in RATES:
        return MetricKind.rate
    if name in POSITIVE:
        return MetricKind.positive
    return MetricKind.signed


def metric_range(key: str) -> tuple[float, float]:
    """The values the metric ``key`` can take: [0, 1] for a rate, [0, ∞) for a positive quantity, [−1, 1] for the
    SSIMs and cosines (:data:`UNIT_SIGNED`), the real line otherwise; a mean and its interval never leave it."""
    kind = metric_kind(key)
    if kind is MetricKind.rate:
        return 0.0, 1.0
    if kind is MetricKind.positive:
        return 0.0, math.inf
    name = key.rsplit("/", 1)[-1]
    for prefix in VARIANT_PREFIXES:
        name = name.removeprefix(prefix)
    return (-1.0, 1.0) if name in UNIT_SIGNED else (-math.inf, math.inf)
