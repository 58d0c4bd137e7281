"""Networks: the classifier registry (``model.name``) and its builders, the inversion and translation networks, VMI's flow."""

from fdattack.models.classifiers import CLASSIFIERS, build_classifier
from fdattack.models.flows import Glow
from fdattack.models.inversion import InversionDecoder
from fdattack.models.translation import PatchDiscriminator, ResnetGenerator

__all__ = ["CLASSIFIERS", "Glow", "InversionDecoder", "PatchDiscriminator", "ResnetGenerator", "build_classifier"]
