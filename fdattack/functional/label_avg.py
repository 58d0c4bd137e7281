"""LabelAvg (Xiao et al., DSN 2024, §V): top-K labels with weights (Eqs. 7-10), voting-based label smoothing
(Eqs. 11-12) and its communication cost (their Table V).

Shapes: N clients, M public samples, C classes, K uploaded labels per sample. A client's upload is handled in
its dense form w_P ⊙ v_P (M, C): β at the K uploaded labels, zeros elsewhere; on the wire it is K labels and
K weights per sample.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

#: bytes of one number on the wire: a label (int32) or a weight or probability (float32), as in Table V
NUMBER_BYTES = 4
MIB = 2**20

LabelWeights = Literal["beta", "ones"]


def top_k_labels(probs: Tensor, k: int, weights: LabelWeights = "beta") -> tuple[Tensor, Tensor]:
    """A client's upload per public sample: its K most probable labels and their weights (Eqs. 7-10).

    The labels are the K indices of the largest probabilities (Eq. 8 read as top-K: its strict ">" κ would keep K − 1), ties
    to the lowest index (a stable descending sort; ``torch.topk`` does not promise an order among equal values).
    β_ζ = p_ζ / p_max (Eq. 10), so the top-1 label weighs exactly 1; ``weights="ones"`` is the all-ones variant
    (plain hard-label votes). A weight is never 0 (floored at the smallest normal float), so every uploaded label counts as a vote.

    Args:
        probs: (M, C) softmax probabilities (Eq. 7; ratios of raw logits would be ill-defined; the paper does not say which).
        k: K, with 1 <= K <= C.
        weights: ``beta`` (Eq. 10) or ``ones``.

    Returns:
        labels (M, K) long, best first, and weights (M, K) in ``probs``' dtype.
    """
    if not 1 <= k <= probs.shape[-1]:
        raise ValueError(f"k must be in [1, {probs.shape[-1]}] (the number of classes), got {k}")
    if weights not in ("beta", "ones"):
        raise ValueError(f"weights must be 'beta' or 'ones', got {weights!r}")
    top, labels = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, labels = top[..., :k], labels[..., :k]
    if weights == "ones":
        return labels, torch.ones_like(top)
    beta = (top / top[..., :1]).clamp_min(torch.finfo(top.dtype).tiny)
    beta[..., 0] = 1.0
    return labels, beta


def label_vector(labels: Tensor, weights: Tensor, num_classes: int) -> Tensor:
    """w_P ⊙ v_P (M, C): ``weights`` at ``labels`` (both (M, K)), zeros off the top-K (Eq. 11)."""
    return weights.new_zeros(*labels.shape[:-1], num_classes).scatter_(-1, labels, weights)


def max_vote(votes: Tensor, mass: Tensor) -> Tensor:
    """(M,) the label with the most votes; ties broken by the larger mass, then by the lowest index (the paper gives no tie rule)."""
    leading = votes == votes.max(dim=-1, keepdim=True).values
    return torch.where(leading, mass, torch.full_like(mass, -torch.inf)).argmax(dim=-1)  # argmax: first maximum


def smooth_labels(uploads: Tensor, k: int, mix_alpha: float, main: Optional[Tensor] = None, renorm: bool = False) -> Tensor:
    """The server's smoothed labels v_smooth (M, C) from the uploads of N clients (Eqs. 11-12).

    Eq. 11: v_smooth = Σ_P w_P ⊙ v_P / (K N). With ``renorm`` each row is then scaled to sum 1 (β weights leave
    it below 1; the paper does not renormalise). Eq. 12: (1 - α) v_main + α v_smooth, with v_main the one-hot of ``main``, or,
    where ``main`` is None or negative (an unlabeled row), of the max vote: votes_c = Σ_P (v_P)_c counts the
    clients that sent label c (a nonzero entry), ties broken by :func:`max_vote`.

    Args:
        uploads: (N, M, C) dense uploads w_P ⊙ v_P (:func:`label_vector`).
        k: K, labels per client and sample.
        mix_alpha: α in [0, 1] (α = 0: hard labels; α = 1: the votes alone).
        main: (M,) ground-truth labels of the public samples (negative = unlabeled), or None for the max vote.
        renorm: renormalise Eq. 11 to sum 1 before Eq. 12.
    """
    if uploads.ndim != 3 or uploads.shape[0] == 0:
        raise ValueError(f"uploads must have shape (N, M, C) with N >= 1, got {tuple(uploads.shape)}")
    mass = uploads.sum(dim=0)
    smooth = mass / (k * uploads.shape[0])
    if renorm:
        smooth = smooth / smooth.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(smooth.dtype).tiny)
    voted = max_vote((uploads > 0).sum(dim=0), mass)
    label = voted if main is None else torch.where(main >= 0, main.to(voted.device), voted)
    v_main = F.one_hot(label, uploads.shape[-1]).to(smooth.dtype)
    return (1 - mix_alpha) * v_main + mix_alpha * smooth


def top_k_upload_bytes(rows: int, k: int) -> int:
    """Bytes of a LabelAvg upload on ``rows`` public samples: K labels and K weights each, 4 bytes a number (which reproduces Table V)."""
    return rows * k * 2 * NUMBER_BYTES


def labelavg_comm_mib(num_clients: int, rounds: int, public_per_round: int, num_classes: int, k: Optional[int] = None) -> float:
    """Total communication in MiB over ``rounds`` rounds, uploads and downloads of every client (Table V).

    FedMD (``k=None``): C logits up and C averaged logits down per sample and client; LabelAvg: K labels and K
    weights up, C smoothed-label entries down. Every number is 4 bytes.
    """
    up = public_per_round * num_classes * NUMBER_BYTES if k is None else top_k_upload_bytes(public_per_round, k)
    down = public_per_round * num_classes * NUMBER_BYTES
    return num_clients * rounds * (up + down) / MIB
