"""The evaluation side: it alone holds the ground truth and turns attacks' typed results into metrics."""

from __future__ import annotations

from typing import Mapping, Optional, Protocol, Sequence

import fdattack.fd.results as results_module
from fdattack.evaluation.oracle import Oracle
from fdattack.evaluation.protocol_metrics import protocol_metrics
from fdattack.evaluation.report import Report
from fdattack.evaluation.scoring import Scorer
from fdattack.fd.boundary import plain_result
from fdattack.fd.results import AttackResult


class Diagnostic(Protocol):
    """An evaluation-side measurement of the models as they are at the end of a round (e.g. the confidence gap)."""

    name: str

    def report(self) -> Report: ...


class Evaluator:
    """Scores the protocol's utility, the diagnostics and every attack result, from ground truth.

    Args:
        oracle: the ground truth (private sets, models).
        scorers: result type -> its scorer, for each type the run's attacks declare in ``produces``
            (built from :data:`~fdattack.evaluation.scoring.SCORERS`).
        diagnostics: measurements reported every round.
    """

    def __init__(self, oracle: Oracle, scorers: Optional[Mapping[type, Scorer]] = None, diagnostics: Sequence[Diagnostic] = ()) -> None:
        self.oracle = oracle
        self.scorers: dict[type, Scorer] = dict(scorers or {})
        self.diagnostics = list(diagnostics)

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
        plain copies of its tensors (:func:`~fdattack.fd.boundary.plain_result`: no attack code runs beside the ground truth)
        and scored by the scorer of its type."""
        report = Report()
        for result in (plain_result(r, results_module.RESULT_TYPES, attack) for r in results):
            report.update(self.scorer_of(attack, result)(attack, result))
        return report

    def scorer_of(self, attack: str, result: AttackResult) -> Scorer:
        """The scorer of ``result``'s type.

        Raises:
            RuntimeError: none was built: the attack returned a type its class does not declare in ``produces``.
        """
        scorer = self.scorers.get(type(result))
        if scorer is None:
            kind = type(result).__name__
            raise RuntimeError(
                f"attack {attack} returned {kind} but does not declare them: set produces = frozenset({{{kind}}}) on its class"
            )
        return scorer
