"""The result types an attack returns (:mod:`fdattack.fd.results`, where the evaluation side reads them), under the
attacks' own package for attack authors: ``from fdattack.attacks.results import Reconstructions``."""

from fdattack.fd.results import (
    RESULT_TYPES,
    AttackResult,
    GradientProbe,
    Inversions,
    LabelDistributions,
    MembershipScores,
    Reconstructions,
)

__all__ = ["RESULT_TYPES", "AttackResult", "GradientProbe", "Inversions", "LabelDistributions", "MembershipScores", "Reconstructions"]
