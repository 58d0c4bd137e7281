"""The typed results attacks return; the evaluation side alone turns them into metrics.

An attack never scores itself: it hands these to :class:`fdattack.evaluation.Evaluator`, which holds the
ground truth: reconstructions (PLI, TBI), label distributions (LDIA), membership scores (LiRA), GAN inversions
(GMI, KED-MI, VMI, the L-Attack's generator) and the L-Attack's gradient estimates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, Optional, Union

from torch import Tensor


@dataclass(frozen=True)
class Reconstructions:
    """One class representation per target label (Takahashi et al., CVPR 2023, §2).

    Attributes:
        images: (T, C, H, W) in [-1, 1].
        labels: (T,) the target label each image claims.
        role: ``"attack"`` (the attack's reconstructions this round) or ``"prior"`` (the public-knowledge
            prior the attack starts from, scored the same way: what the attack must beat, Table S-3).
    """

    images: Tensor
    labels: Tensor
    role: Literal["attack", "prior"] = "attack"


@dataclass(frozen=True)
class LabelDistributions:
    """Each client's estimated label distribution p̂ (Shi et al., PoPETs 2025, §3.2).

    Attributes:
        clients: the clients estimated, in row order.
        estimates: (n, M) rows that sum to 1.
    """

    clients: tuple[int, ...]
    estimates: Tensor


@dataclass(frozen=True)
class MembershipScores:
    """Per target client, a membership score for every candidate sample the attacker holds (Shi et al., PoPETs 2025, §3.3).

    Columns follow the attacker's candidate set (:attr:`AttackerView.candidates <fdattack.fd.threat.AttackerView.candidates>`);
    the attacker never learns which candidates are whose members, so it scores all of them for every client
    and the evaluator picks each client's members and non-members.

    Attributes:
        clients: the target clients, in row order.
        scores: (n, C) float64, higher = more likely a member of that client (the unsaturated score).
        name: the metric prefix (``attack/<name>/...``) where one attack reports several variants; None = the attack's name.
        paper_scores: (n, C) the paper's float32 λ, scored as ``paper_<metric>`` for parity (ties at 1.0 included), or None.
        details: the attack's own diagnostics of how it scored (e.g. references per client), logged as they are.
    """

    clients: tuple[int, ...]
    scores: Tensor
    name: Optional[str] = None
    paper_scores: Optional[Tensor] = None
    details: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Inversions:
    """Class-representative images a model-inversion attack made for each target label, several per label
    (Wu et al., ICLR 2024, §3.1: GMI's restarts, KED-MI's draws from its learned Gaussians, VMI's miner samples).

    Attributes:
        images: (S, T, C, H, W) in [-1, 1]: S samples (seeds, draws) for each of the T target labels.
        labels: (T,) the target label of each column.
        name: the metric prefix (``attack/<name>/...``) where one attack reports several variants; None = the attack's name.
        details: the attack's own diagnostics (e.g. its final loss terms), logged as they are.
    """

    images: Tensor
    labels: Tensor
    name: Optional[str] = None
    details: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GradientProbe:
    """Zeroth-order estimates of ∂L/∂x and the points they were taken at, for the evaluation side to compare with the
    true gradient through the victim's network, which the attack never holds (Xiao et al., DSN 2024, §VI-A, Fig. 4).

    Attributes:
        points: (P, C, H, W) the images the victim was queried at, in [-1, 1].
        estimate: (P, C, H, W) the attack's estimate of ∂L/∂x at each point (Eq. 6).
        victim: the client queried.
        target_class: c*.
        loss: the loss kind (``ce`` | ``neg_logit`` | ``neg_prob``), taken on the victim's undefended logits for the truth.
        name: the metric prefix (``attack/<name>/...``); None = the attack's name.
    """

    points: Tensor
    estimate: Tensor
    victim: int
    target_class: int
    loss: str
    name: Optional[str] = None


#: every result type an attack may return
AttackResult = Union[Reconstructions, LabelDistributions, MembershipScores, Inversions, GradientProbe]
#: the result types, exactly (the evaluation side takes no subclass: see :func:`fdattack.fd.boundary.plain_result`)
RESULT_TYPES: tuple[type, ...] = (Reconstructions, LabelDistributions, MembershipScores, Inversions, GradientProbe)
