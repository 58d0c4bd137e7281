"""Networks: the classifier registry (``model.name``) and its builders."""

from fdattack.models.classifiers import CLASSIFIERS, build_classifier
from fdattack.models.inversion import InversionDecoder

__all__ = ["CLASSIFIERS", "InversionDecoder", "build_classifier"]
