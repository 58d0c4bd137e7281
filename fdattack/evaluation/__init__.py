"""The evaluator: the only side that holds the ground truth (:class:`Oracle`: private sets, models), and turns results into metrics.
Every result type has one scorer, registered in its scorer's module on :data:`SCORERS` and built from a :class:`ScoringContext`.
It never imports an attack's internals: of ``fdattack.attacks`` it reads only ``fdattack.fd.results``, the typed results."""

# importing this package registers every result type's scorer (one line per scorer's module)
from fdattack.evaluation import gradient_check, inversion, label_distribution, membership, reconstruction  # noqa: F401  (registration)
from fdattack.evaluation.confidence_gap import ConfidenceGapDiagnostic
from fdattack.evaluation.evaluator import Diagnostic, Evaluator
from fdattack.evaluation.identity import IdentityScorer, train_identity_scorer
from fdattack.evaluation.oracle import Oracle
from fdattack.evaluation.protocol_metrics import protocol_metrics
from fdattack.evaluation.reconstruction import ReconstructionScorer
from fdattack.evaluation.report import Report
from fdattack.evaluation.scoring import SCORERS, Scorer, ScoringContext, check_labels

__all__ = [
    "SCORERS",
    "ConfidenceGapDiagnostic",
    "Diagnostic",
    "Evaluator",
    "IdentityScorer",
    "Oracle",
    "ReconstructionScorer",
    "Report",
    "Scorer",
    "ScoringContext",
    "check_labels",
    "protocol_metrics",
    "train_identity_scorer",
]
