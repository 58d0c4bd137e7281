"""The L-Attack's gradient check (Xiao et al., DSN 2024, §VI-A, Fig. 4): its zeroth-order estimates against the true ∂L/∂x.

The truth needs the victim's network, white-box, which only the evaluation side holds: autograd through it in eval
mode on its undefended logits, with the attack's loss kind. Metrics under ``attack/<name>/``: ``grad_cosine`` (mean
over the probe's points of cos(ĝ, ∇L)), its Student-t interval over the points (``grad_cosine_ci_low``, ``_ci_high``:
the points are the units, each a fresh generator draw with its own random directions) and
``grad_cosine_std``; histograms ``grad_true`` and ``grad_estimate`` of the
first point's element values (Fig. 4 compares such histograms). At the paper's m ≪ d expect small cosines,
E cos ≈ sqrt(m / (m + d)) for an exactly answered loss (Eq. 6).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.evaluation.oracle import Oracle
from fdattack.evaluation.report import Report
from fdattack.evaluation.scoring import SCORERS, ScoringContext
from fdattack.fd.results import GradientProbe
from fdattack.functional.losses import target_class_loss
from fdattack.lit.modes import eval_mode
from fdattack.statistics.intervals import interval_keys, mean_interval


def true_gradient(net: nn.Module, points: Tensor, target: int, loss: str) -> Tensor:
    """(P, C, H, W) ∂L/∂x of each point by autograd through ``net`` (eval mode, its parameters untouched), L on its logits."""
    device = next(net.parameters()).device
    x = points.detach().to(device).requires_grad_(True)
    with eval_mode(net), torch.enable_grad():
        (grad,) = torch.autograd.grad(target_class_loss(net(x).float(), target, loss, "logits").sum(), x)
    return grad.cpu()


def gradient_cosines(estimate: Tensor, truth: Tensor) -> Tensor:
    """(P,) cos(ĝ_p, ∇L_p) per point (0 where either is zero)."""
    return F.cosine_similarity(estimate.flatten(1).double(), truth.flatten(1).double(), dim=1).float()


class GradientCheck:
    """Scores :class:`~fdattack.fd.results.GradientProbe` against the victim's network (ground truth).

    Args:
        oracle: the evaluation side's models (the clients' networks as they are at the round's end, the state the
            attack queried at its attack point).
    """

    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle

    def __call__(self, attack: str, probe: GradientProbe) -> Report:
        name = probe.name or attack
        truth = true_gradient(self.oracle.clients[probe.victim].module.net, probe.points, probe.target_class, probe.loss)
        cosines = gradient_cosines(probe.estimate, truth)
        std = float(cosines.std()) if len(cosines) > 1 else 0.0
        metrics = {
            f"attack/{name}/grad_cosine": float(cosines.mean()),
            f"attack/{name}/grad_cosine_std": std,
            **interval_keys(f"attack/{name}/grad_cosine", mean_interval("grad_cosine", cosines.double().numpy())),
        }
        return Report(
            metrics=metrics,
            histograms={f"attack/{name}/grad_true": truth[0].flatten(), f"attack/{name}/grad_estimate": probe.estimate[0].flatten()},
        )


@SCORERS.register(GradientProbe, on_round_models=True)
def build_gradient_check(context: ScoringContext) -> GradientCheck:
    """The check against the clients' networks of the run."""
    return GradientCheck(context.oracle)
