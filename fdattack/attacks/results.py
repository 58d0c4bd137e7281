"""The typed results attacks return; the evaluation side alone turns them into metrics.

An attack never scores itself: it hands these to :class:`fdattack.evaluation.Evaluator`, which holds the
ground truth. The families to come add their own types here (label distributions, membership scores).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from torch import Tensor


@dataclass(frozen=True)
class Reconstructions:
    """One class representation per target label (pli.md §2 "Goal").

    Attributes:
        images: (T, C, H, W) in [-1, 1].
        labels: (T,) the target label each image claims.
        role: ``"attack"`` (the attack's reconstructions this round) or ``"prior"`` (the public-knowledge
            prior the attack starts from, scored the same way: what the attack must beat, Table S-3).
    """

    images: Tensor
    labels: Tensor
    role: Literal["attack", "prior"] = "attack"


#: every result type an attack may return
AttackResult = Union[Reconstructions]
