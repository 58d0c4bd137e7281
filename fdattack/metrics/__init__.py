"""Metrics shared by every attack."""

from fdattack.metrics.attack_accuracy import AttackAccuracy, attack_accuracy, class_means
from fdattack.metrics.identity import IdentityScorer
from fdattack.metrics.image import gaussian_window, pairwise_ssim, paper_ssim, standard_ssim, total_variation

__all__ = ["AttackAccuracy", "IdentityScorer", "attack_accuracy", "class_means", "gaussian_window", "pairwise_ssim", "paper_ssim",
           "standard_ssim", "total_variation"]
