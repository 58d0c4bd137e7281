"""LightningModules, usable on their own in any Lightning project."""

from fdattack.lit.classifier import ClassifierLitModule, cross_entropy
from fdattack.lit.inversion import InversionLitModule

__all__ = ["ClassifierLitModule", "InversionLitModule", "cross_entropy"]
