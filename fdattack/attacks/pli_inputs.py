"""PLI's confidence-gap optimal inputs of the inversion network (Takahashi et al., CVPR 2023, §3.2, Eqs. 4-6)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fdattack.functional import entropy


def confidence_gap_q(p_client: Tensor, p_server: Tensor, label: int, alpha: float) -> Tensor:
    """Q = p^k_j + p^0_j + alpha * H(p^0) (Eq. 4), natural-log entropy of the whole server vector."""
    return p_client[..., label] + p_server[..., label] + alpha * entropy(p_server)


def optimal_server_input(labels: Tensor, num_classes: int, alpha: float) -> Tensor:
    """p-hat^0 of Eq. 6 per row: softmax(e_j / alpha), i.e. e^(1/alpha) / (J - 1 + e^(1/alpha)) at j.

    Args:
        labels: (B,) target labels j.
        num_classes: J.
        alpha: entropy weight > 0.

    Returns:
        (B, J) rows on the simplex.
    """
    one_hot = torch.nn.functional.one_hot(labels.long(), num_classes).float()
    return torch.softmax(one_hot / alpha, dim=-1)


def optimal_client_input(labels: Tensor, num_classes: int) -> Tensor:
    """p-hat^k of Eq. 6: the one-hot vector of j. Shape (B, J)."""
    return torch.nn.functional.one_hot(labels.long(), num_classes).float()


def optimal_inputs(labels: Tensor, num_classes: int, alpha: float) -> Tensor:
    """The inversion network's input [p-hat^0, p-hat^k] (server first, as the authors' code), shape (B, 2J)."""
    return torch.cat([optimal_server_input(labels, num_classes, alpha), optimal_client_input(labels, num_classes)], dim=-1)


def alpha_for_peak(peak: float, num_classes: int) -> float:
    """Inverse of Eq. 6: the alpha whose p-hat^0_j equals ``peak`` (the authors' ``get_alpha``)."""
    return 1.0 / math.log(peak * (num_classes - 1) / (1.0 - peak))


def tempered_softmax(outputs: Tensor, kind: str, temperature: float, tau: float) -> Tensor:
    """softmax(l / tau) from what a client sent: logits l, or probabilities q = softmax(l / T).

    For probabilities, T·log q equals l up to a per-row constant, so softmax(T·log q / tau) is exactly the
    tempered softmax the attack wants: nothing is lost.

    Args:
        outputs: (N, J) logits or probabilities.
        kind: ``"logits"`` or ``"probs"``.
        temperature: T of ``probs`` outputs.
        tau: the attack's temperature.
    """
    if kind == "logits":
        return torch.softmax(outputs / tau, dim=-1)
    log_q = torch.log(outputs.clamp_min(torch.finfo(outputs.dtype).tiny))
    return torch.softmax(temperature * log_q / tau, dim=-1)
