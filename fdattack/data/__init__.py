"""Datasets, partitions, domain transforms and the FederatedData module (the split every side is built from).

Contract: the ground floor of the sides: reads files and scikit-learn's digits, never downloads, and imports nothing of
fdattack but errors and the registry.
"""

from fdattack.data import purchase  # noqa: F401  (registration)
from fdattack.data.datasets import DATASETS, RawDataset
from fdattack.data.domains import DOMAIN_TRANSFORMS, box_blur, register_domain_transform
from fdattack.data.federated import FederatedData, FederatedSplit, build_split
from fdattack.data.imageset import AUXILIARY, SENSITIVE, UNLABELED, ImageSet, IndexedBatch

__all__ = [
    "DATASETS",
    "RawDataset",
    "DOMAIN_TRANSFORMS",
    "box_blur",
    "register_domain_transform",
    "FederatedData",
    "FederatedSplit",
    "build_split",
    "ImageSet",
    "IndexedBatch",
    "SENSITIVE",
    "AUXILIARY",
    "UNLABELED",
]
