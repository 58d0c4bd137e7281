"""Defense registry: importing this package registers every defense (one line per defense)."""

from fdattack.defenses import bido, dpsgd, laplace, mid, rounding, topk  # noqa: F401  (registration)
from fdattack.defenses.base import DEFENSES, Defense, Release, TrainingDefense, UploadDefense

__all__ = ["DEFENSES", "Defense", "Release", "TrainingDefense", "UploadDefense"]
