"""LightningModules, usable on their own in any Lightning project."""

from fdattack.lit.classifier import ClassifierLitModule, cross_entropy
from fdattack.lit.gan import WGANGP, KPlusOneGAN
from fdattack.lit.inversion import InversionLitModule
from fdattack.lit.lattack import LAttackGenerator
from fdattack.lit.translation import CycleGANLitModule, RestorerLitModule, TranslationLitModule
from fdattack.lit.vmi import VMIMinerLitModule

__all__ = ["ClassifierLitModule", "CycleGANLitModule", "InversionLitModule", "KPlusOneGAN", "LAttackGenerator", "RestorerLitModule", "TranslationLitModule",
           "VMIMinerLitModule", "WGANGP", "cross_entropy"]
