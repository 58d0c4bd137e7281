"""LightningModules, usable on their own in any Lightning project (``Trainer.fit``), with plain constructors.

Contract: imports networks (:mod:`fdattack.models`), data types and pure math only; never the engine, the protocols,
the attacks or the evaluation side (an import-linter contract).
"""

from fdattack.lit.classifier import ClassifierLitModule, cross_entropy
from fdattack.lit.gan import WGANGP, KPlusOneGAN
from fdattack.lit.inversion import InversionLitModule
from fdattack.lit.lattack import LAttackGenerator
from fdattack.lit.translation import CycleGANLitModule, RestorerLitModule, TranslationLitModule
from fdattack.lit.vmi import VMIMinerLitModule

__all__ = [
    "ClassifierLitModule",
    "CycleGANLitModule",
    "InversionLitModule",
    "KPlusOneGAN",
    "LAttackGenerator",
    "RestorerLitModule",
    "TranslationLitModule",
    "VMIMinerLitModule",
    "WGANGP",
    "cross_entropy",
]
