"""RMIA against federated distillation (Zarifzadeh, Liu & Shokri, ICML 2024, §3, offline), in the two settings PDA-FD
gives LiRA (Shi et al., PoPETs 2025, §3.3): ``rmia_coop`` takes the other clients with a similar label distribution as
reference models, ``rmia_distill`` students distilled from the target's own uploads on public rows.

Each is its LiRA variant with RMIA's test in place of LiRA's Gaussian one: the candidates' outputs are collected the same
way (the same adversary, rounds and evasion handling), and a candidate x is scored by the share of the other candidates z
it dominates, LR(x, z) = (Pr(x|θ)/Pr(x)) / (Pr(z|θ)/Pr(z)) ≥ γ (:func:`~fdattack.functional.rmia.offline_rmia`).
Pr(·|θ) is the target's probability of the candidate's label, as its outputs give it (softmax of uploaded logits, or the
uploaded probabilities); Pr(·) comes from the references. The population z is the candidate pool itself: the
attacker's labelled samples, most of which are not the target's (a client holds a share of the members), so no
other data is needed. RMIA keeps its power with one to four references (the paper's few-reference experiments), where
LiRA's per-sample Gaussian has too few to fit: ``rmia_distill`` distils 4 students per client by default, not LiRA's 32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from fdattack.attacks.base import ATTACKS
from fdattack.attacks.lira import CoopKnobs, CoopLiRAAttack, DistillKnobs, DistillLiRAAttack, MembershipSettings
from fdattack.functional.rmia import offline_rmia
from fdattack.knobs import knob


@dataclass
class RMIAKnobs:
    offline_a: float = knob(
        0.3,
        "a in Pr(x) = ((1 + a) Pr_OUT(x) + 1 - a) / 2, the offline estimate of x's marginal from OUT references (the authors' "
        "CIFAR-10 configs: 0.3)",
        ge=0,
        le=1,
    )
    gamma: float = knob(2.0, "the likelihood-ratio threshold: x dominates z where LR(x, z) >= gamma (the authors' configs: 2)", gt=0)


@dataclass
class RMIACoopSettings(RMIAKnobs, CoopKnobs, MembershipSettings):
    pass


@dataclass
class RMIADistillSettings(RMIAKnobs, DistillKnobs, MembershipSettings):
    students: int = knob(4, "K, students distilled from each target client, RMIA's reference models (few suffice: 1 to 4)", ge=1)


class RMIATest:
    """RMIA's test of each candidate against the others, for a LiRA variant's targets and references."""

    settings: RMIAKnobs

    def statistic(
        self, target: Tensor, references: Tensor, reference_answered: Optional[Tensor], testable: Tensor
    ) -> tuple[Tensor, Optional[Tensor]]:
        """Score_MIA of every candidate from the φ (log-odds of the label) of the target (C,) and the references (K, C):
        Pr(x|θ) = sigmoid(φ); the ``testable`` candidates are the population. No paper score (the paper's is this one)."""
        s = self.settings
        return offline_rmia(torch.sigmoid(target), torch.sigmoid(references), testable, s.offline_a, s.gamma, reference_answered), None


@ATTACKS.register("rmia_coop")
class CoopRMIAAttack(RMIATest, CoopLiRAAttack):
    """Co-op RMIA: Co-op LiRA's references (the other clients whose LDIA estimates are within ``beta``), RMIA's test."""

    name = "rmia_coop"
    Settings = RMIACoopSettings


@ATTACKS.register("rmia_distill")
class DistillRMIAAttack(RMIATest, DistillLiRAAttack):
    """Distillation RMIA: distillation LiRA's students (``students`` per target, 4 by default), RMIA's test."""

    name = "rmia_distill"
    Settings = RMIADistillSettings
