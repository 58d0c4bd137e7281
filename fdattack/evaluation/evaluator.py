"""The evaluation side: it alone holds the ground truth and turns attacks' typed results into metrics."""

from __future__ import annotations

from typing import Optional, Protocol, Sequence, TypeVar

from fdattack.attacks.results import RESULT_TYPES, AttackResult, GradientProbe, Inversions, LabelDistributions, MembershipScores, Reconstructions
from fdattack.evaluation.gradient_check import GradientCheck
from fdattack.evaluation.inversion import InversionScorer
from fdattack.evaluation.label_distribution import LabelDistributionScorer
from fdattack.evaluation.membership import MembershipScorer
from fdattack.evaluation.oracle import Oracle
from fdattack.evaluation.protocol_metrics import protocol_metrics
from fdattack.evaluation.reconstruction import ReconstructionScorer
from fdattack.evaluation.report import Report
from fdattack.fd.boundary import plain_result
from fdattack.functional.intervals import HIGH, LOW

#: the prior's scores worth a line of their own (Table S-3 and what an inversion must beat)
PRIOR_METRICS = ("ssim", "accuracy", "eval_top1")


Scorer = TypeVar("Scorer")


def _declared(scorer: Optional[Scorer], attack: str, result: AttackResult) -> Scorer:
    """The scorer of ``result``'s type; None means the attack returned a type its class does not declare in ``produces``."""
    if scorer is None:
        kind = type(result).__name__
        raise RuntimeError(f"attack {attack} returned {kind} but does not declare them: set produces = frozenset({{{kind}}}) on its class")
    return scorer


class Diagnostic(Protocol):
    """An evaluation-side measurement of the models as they are at the end of a round (e.g. the confidence gap)."""

    name: str

    def report(self) -> Report: ...


class Evaluator:
    """Scores the protocol's utility, the diagnostics and every attack result, from ground truth.

    Args:
        oracle: the ground truth (private sets, models).
        reconstructions: scorer of :class:`Reconstructions` (None when no attack reconstructs).
        diagnostics: measurements reported every round.
        label_distributions: scorer of :class:`LabelDistributions` (None when no attack estimates them).
        membership: scorer of :class:`MembershipScores` (None when no attack infers membership).
        inversions: scorer of :class:`Inversions` (None when no attack inverts the model).
        gradients: scorer of :class:`GradientProbe` (None when no attack estimates gradients).
    """

    def __init__(self, oracle: Oracle, reconstructions: Optional[ReconstructionScorer] = None, diagnostics: Sequence[Diagnostic] = (),
                 label_distributions: Optional[LabelDistributionScorer] = None, membership: Optional[MembershipScorer] = None,
                 inversions: Optional[InversionScorer] = None, gradients: Optional[GradientCheck] = None) -> None:
        self.oracle = oracle
        self.reconstructions = reconstructions
        self.diagnostics = list(diagnostics)
        self.label_distributions = label_distributions
        self.membership = membership
        self.inversions = inversions
        self.gradients = gradients

    def setup_report(self) -> Report:
        """After the set-up phases (round 0): the protocol's utility metrics."""
        return Report(metrics=protocol_metrics(self.oracle))

    def round_report(self) -> Report:
        """After a round: the protocol's utility metrics and every diagnostic."""
        report = self.setup_report()
        for diagnostic in self.diagnostics:
            report.update(diagnostic.report())
        return report

    def score(self, attack: str, results: Sequence[AttackResult]) -> Report:
        """``attack/<attack>/...`` metrics, images and artifacts of an attack's results this round, each result taken as
        plain copies of its tensors (:func:`~fdattack.fd.boundary.plain_result`: no attack code runs beside the ground truth)."""
        report = Report()
        for result in (plain_result(r, RESULT_TYPES, attack) for r in results):
            if isinstance(result, Reconstructions):
                report.update(self._score_reconstructions(attack, result))
            elif isinstance(result, LabelDistributions) and self.label_distributions is not None:
                report.update(self.label_distributions(attack, result))
            elif isinstance(result, MembershipScores) and self.membership is not None:
                report.update(self.membership(attack, result))
            elif isinstance(result, Inversions):
                scorer = _declared(self.inversions, attack, result)
                self.check_labels(attack, result)
                report.update(scorer(attack, result))
            elif isinstance(result, GradientProbe):
                report.update(_declared(self.gradients, attack, result)(attack, result))
            else:
                raise TypeError(f"the evaluator has no scorer for {type(result).__name__} (from attack {attack})")
        return report

    def check_labels(self, attack: str, result: Reconstructions | Inversions) -> None:
        """Refuse a result whose labels are not the split's targets (an attack bug, never scored).

        :class:`Reconstructions` carry one image per target label: their labels are the target labels, each once, in
        any order. :class:`Inversions` carry distinct labels, each a target label (GMI, KED-MI, VMI invert every
        target; the L-Attack the one class c* its settings name, which must be a private class).

        Raises:
            RuntimeError: one line naming the attack, the labels it returned and the targets.
        """
        kind = type(result).__name__
        labels = [int(y) for y in result.labels.reshape(-1).tolist()]
        targets = sorted(int(j) for j in self.oracle.split.target_labels)
        column = 0 if isinstance(result, Reconstructions) else 1
        if isinstance(result, Reconstructions):
            wrong = sorted(labels) != targets
            rule = "one image per target label"
        else:
            wrong = len(set(labels)) != len(labels) or not set(labels) <= set(targets)
            rule = "distinct target labels"
        if wrong or result.labels.dim() != 1 or result.images.shape[column] != len(labels):
            shape = f"{len(labels)} labels for images of shape {tuple(result.images.shape)}"
            raise RuntimeError(f"attack {attack} returned {kind} for labels {labels} ({shape}), but they must be {rule}: "
                               f"the target labels are {targets}")

    def _score_reconstructions(self, attack: str, result: Reconstructions) -> Report:
        scorer = _declared(self.reconstructions, attack, result)
        self.check_labels(attack, result)
        scores, grid = scorer(result.images, result.labels)
        if result.role == "prior":
            kept = [k + end for k in PRIOR_METRICS for end in ("", LOW, HIGH)]  # each with its interval
            return Report(metrics={f"attack/{attack}/prior_{k}": scores[k] for k in kept if k in scores},
                          images={f"attack/{attack}/prior": grid},
                          artifacts={f"{attack}_prior": {"images": result.images, "labels": result.labels}})
        return Report(
            metrics={f"attack/{attack}/{k}": v for k, v in scores.items()},
            images={f"attack/{attack}/reconstructions": grid},
            artifacts={f"{attack}_reconstructions": {"images": result.images, "labels": result.labels}},
        )
