"""Networks: the classifier registry (``model.name``) and its builders, the inversion, translation and GAN networks, VMI's flow.

Contract: plain ``torch.nn`` modules; imports nothing of fdattack but the registry.
"""

from fdattack.models.classifiers import CLASSIFIERS, build_classifier
from fdattack.models.flows import Glow
from fdattack.models.gan import DGWGAN, Generator, MinibatchDiscriminator
from fdattack.models.inversion import InversionDecoder
from fdattack.models.translation import PatchDiscriminator, ResnetGenerator

__all__ = [
    "CLASSIFIERS",
    "DGWGAN",
    "Generator",
    "Glow",
    "InversionDecoder",
    "MinibatchDiscriminator",
    "PatchDiscriminator",
    "ResnetGenerator",
    "build_classifier",
]
