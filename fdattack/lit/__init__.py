"""LightningModules, usable on their own in any Lightning project."""

from fdattack.lit.classifier import ClassifierLitModule, cross_entropy

__all__ = ["ClassifierLitModule", "cross_entropy"]
