"""Defenses: upload transforms (what a client sends) and training-time defenses (how it trains), registered here by
importing their modules (one line per defense).

Contract: a defense sees only the payload it transforms or the network and optimizer it wraps, with a seed derived
from the run's; it imports the wire's types and the engine, never an attack or the evaluation side.
"""

from fdattack.defenses import bido, dpsgd, laplace, mid, rounding, topk  # noqa: F401  (registration)
from fdattack.defenses.base import DEFENSES, Defense, Release, TrainingDefense, UploadDefense

__all__ = ["DEFENSES", "Defense", "Release", "TrainingDefense", "UploadDefense"]
