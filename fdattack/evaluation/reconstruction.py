"""Ground-truth scoring of :class:`~fdattack.fd.results.Reconstructions` (Takahashi et al., CVPR 2023, §4.1): it reads private data, so
attacks never hold it. The attack's reconstructions and the prior it starts from (``role="prior"``) are scored alike."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fdattack.data.federated import FederatedSplit
from fdattack.evaluation.identity import IdentityScorer, train_identity_scorer
from fdattack.evaluation.report import Report
from fdattack.evaluation.scoring import SCORERS, ScoringContext, check_labels
from fdattack.fd.results import Reconstructions
from fdattack.functional.attack_accuracy import attack_accuracy, class_means
from fdattack.functional.image import standard_ssim
from fdattack.randomness import derive_seed
from fdattack.statistics.intervals import HIGH, LOW, TRIALS, interval_keys, mean_interval, wilson_interval, wilson_interval_of_rate

#: the prior's scores worth a line of their own (Table S-3 and what an inversion must beat)
PRIOR_METRICS = ("ssim", "accuracy", "eval_top1")


class ReconstructionScorer:
    """Scores :class:`Reconstructions` against the private and public class means (:meth:`measure`).

    Metrics: accuracy, ssim, ssim_standard, too_close_to_public, chance, and with ``identity`` eval_top1,
    eval_top5, eval_top1_public_look and eval_classifier_accuracy. The unit is the target (one reconstruction each), so
    their 95 % intervals (``_ci_low``, ``_ci_high``) are: Wilson over the T targets for accuracy, eval_top1 and
    eval_top5 (one trial each), over the targets with a public look for eval_top1_public_look, and T times it for
    too_close_to_public (a count of targets); Student's t over the targets for both SSIMs (means of a handful of
    units: a percentile bootstrap of 5 values is about a third too narrow); Wilson over the classifier's held-out images
    for eval_classifier_accuracy. chance (1/T) is exact. The grid (C, T*H, 3W) in [0, 1] has one row per target: the
    reconstruction, the private mean and the public mean of its label. Private means pool every client's
    private images (as the authors' code takes them); public means mix both looks, with the true public labels.

    The attack's reconstructions give ``attack/<attack>/<metric>`` for every metric, the grid
    ``attack/<attack>/reconstructions`` and the artifact ``<attack>_reconstructions``; its prior (``role="prior"``) gives
    ``attack/<attack>/prior_<metric>`` for :data:`PRIOR_METRICS` (with their intervals), the grid ``attack/<attack>/prior``
    and the artifact ``<attack>_prior``.

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
        self.target_labels = tuple(int(j) for j in split.target_labels)

    def __call__(self, attack: str, result: Reconstructions) -> Report:
        """The report of one attack's reconstructions (or prior); refuses labels that are not the targets, each once
        (:func:`~fdattack.evaluation.scoring.check_labels`)."""
        check_labels(attack, result, self.target_labels)
        scores, grid = self.measure(result.images, result.labels)
        if result.role == "prior":
            kept = [k + end for k in PRIOR_METRICS for end in ("", LOW, HIGH, TRIALS)]  # each with its interval and trials
            return Report(
                metrics={f"attack/{attack}/prior_{k}": scores[k] for k in kept if k in scores},
                images={f"attack/{attack}/prior": grid},
                artifacts={f"{attack}_prior": {"images": result.images, "labels": result.labels}},
            )
        return Report(
            metrics={f"attack/{attack}/{k}": v for k, v in scores.items()},
            images={f"attack/{attack}/reconstructions": grid},
            artifacts={f"{attack}_reconstructions": {"images": result.images, "labels": result.labels}},
        )

    def measure(self, recon: Tensor, labels: Tensor) -> tuple[dict[str, float], Tensor]:
        """``(reconstructions (T,C,H,W), labels (T,)) -> (metrics, grid)``."""
        result = attack_accuracy(recon, labels, self.private_means, self.public_means)
        columns = [recon, self.private_means[labels], torch.nan_to_num(self.public_means[labels], nan=-1.0)]
        grid = torch.cat([torch.cat(list(column), dim=-2) for column in columns], dim=-1)
        targets = len(labels)
        standard = standard_ssim(recon, self.private_means[labels])
        too_close = wilson_interval(int(result.too_close_to_public), targets)
        metrics = {
            "accuracy": result.accuracy,
            **interval_keys("accuracy", wilson_interval(int(result.success.sum()), targets)),
            "accuracy" + TRIALS: float(targets),
            "ssim": result.ssim_private_mean,
            **interval_keys("ssim", mean_interval("ssim", result.ssim_per_target.numpy())),
            "ssim_standard": float(standard.mean()),
            **interval_keys("ssim_standard", mean_interval("ssim_standard", standard.numpy())),
            "too_close_to_public": float(result.too_close_to_public),
            **interval_keys("too_close_to_public", (too_close[0] * targets, too_close[1] * targets)),
            "chance": 1.0 / targets,
        }
        if self.identity is not None:
            identity = self.identity(recon, labels)
            metrics.update(identity)
            for key in ("eval_top1", "eval_top5"):
                metrics.update(interval_keys(key, wilson_interval_of_rate(identity[key], targets)), **{key + TRIALS: float(targets)})
            if "eval_top1_public_look" in identity:
                looks = sum(int(y) in self.identity.public_look_hits() for y in labels)
                metrics.update(interval_keys("eval_top1_public_look", wilson_interval_of_rate(identity["eval_top1_public_look"], looks)))
                metrics["eval_top1_public_look" + TRIALS] = float(looks)
            accuracy = wilson_interval_of_rate(identity["eval_classifier_accuracy"], self.identity.test_images)
            metrics.update(interval_keys("eval_classifier_accuracy", accuracy))
        return metrics, (grid * 0.5 + 0.5).clamp(0, 1)


@SCORERS.register(Reconstructions)
def build_reconstruction_scorer(context: ScoringContext) -> ReconstructionScorer:
    """The scorer of reconstructions with its evaluation classifier (``evaluation.classifier``; None: no ``eval_*``
    metrics), trained here from a seed of its own."""
    cfg, ev = context.cfg, context.cfg.evaluation
    identity = (
        train_identity_scorer(
            context.oracle.split,
            context.oracle.engine,
            ev.classifier,
            ev.epochs,
            ev.lr,
            derive_seed(cfg.seed, 0, "evaluation_classifier"),
            context.cache,
            context.announce,
        )
        if ev.classifier
        else None
    )
    return ReconstructionScorer(context.oracle.split, identity)
