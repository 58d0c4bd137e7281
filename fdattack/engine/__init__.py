"""The training engine: every network of a run trains and predicts here, through Lightning Fabric.

Contract: knows models, data rows, objectives and seeds, nothing of federated learning, attacks or scoring;
imports only the ground floor (``data``, ``lit``, ``randomness``, ``errors``). :class:`LocalTrainer` loops one model
at a time or, where it can, trains same-architecture models as one vmapped batch (:mod:`fdattack.engine.vectorised`).
"""

from fdattack.engine.jobs import (
    Batchable,
    BatchSampler,
    FitJob,
    FitResult,
    FitSession,
    ModelHandle,
    PrivateSteps,
    TensorRows,
    clear_gradients,
    epoch_order,
    has_batch_norm,
    without_lone_row,
)
from fdattack.engine.trainer import LocalTrainer, default_engine, make_fabric, predict_logits

__all__ = [
    "BatchSampler",
    "Batchable",
    "FitJob",
    "FitResult",
    "FitSession",
    "LocalTrainer",
    "ModelHandle",
    "PrivateSteps",
    "TensorRows",
    "clear_gradients",
    "default_engine",
    "epoch_order",
    "has_batch_norm",
    "make_fabric",
    "predict_logits",
    "without_lone_row",
]
