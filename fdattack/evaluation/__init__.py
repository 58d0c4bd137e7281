"""The evaluation side: ground truth (:class:`Oracle`), the protocol's utility metrics, diagnostics, and the
:class:`Evaluator` that turns attacks' typed results into ``attack/<name>/...`` metrics, grids and artifacts."""

from fdattack.evaluation.confidence_gap import ConfidenceGapDiagnostic
from fdattack.evaluation.evaluator import Diagnostic, Evaluator
from fdattack.evaluation.identity import train_identity_scorer
from fdattack.evaluation.oracle import Oracle
from fdattack.evaluation.protocol_metrics import protocol_metrics
from fdattack.evaluation.reconstruction import ReconstructionScorer
from fdattack.evaluation.report import Report

__all__ = ["ConfidenceGapDiagnostic", "Diagnostic", "Evaluator", "Oracle", "ReconstructionScorer", "Report", "protocol_metrics",
           "train_identity_scorer"]
