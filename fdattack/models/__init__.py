"""Networks: the classifier registry (``model.name``) and its builders."""

from fdattack.models.classifiers import CLASSIFIERS, build_classifier

__all__ = ["CLASSIFIERS", "build_classifier"]
