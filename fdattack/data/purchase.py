"""Purchase for PDA-FD's setting (Shi et al., PoPETs 2025, Table 10: 10 classes, whose making the paper does not
describe; the construction below is a choice): Shokri et al.'s 600 binary purchase features, 10 k-means labels.

File: ``data.root/dataset_purchase``, the file of Shokri et al.'s membership-inference release (197,324 lines, one
record a line, comma-separated): the original label 1..100 first, then 600 features in {0, 1}.

Construction (fixed, like an official test split; the run seed only cuts public from private afterwards):

1. labels: k-means on the 600 features, k = 10, ``random_state=0``, ``n_init=10`` (scikit-learn 1.2.2's default,
   the version the authors pin); the original 100 labels are dropped;
2. 38,551 records drawn at random (seed 0), or every record of a smaller file;
3. 30 % of them (11,565) the test set, the other 26,986 the pool that ``data.public_fraction=0.2`` cuts 4:1 into
   the private pool (21,589) and the public set (5,397).

A record is a 600-channel 1x1 "image", (N, 600, 1, 1), so the pipeline's (N, C, H, W) contract holds and the ``mlp``
classifier sees C·H·W = 600 inputs. The features stay 0 / 1 (as they are, not mapped to
±1): a subset of [-1, 1], the range every loader promises.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from fdattack.data.datasets import DATASETS, RawDataset
from fdattack.errors import ConfigError, DataError

log = logging.getLogger(__name__)

FILE_NAME = "dataset_purchase"
NUM_FEATURES = 600
NUM_CLUSTERS = 10  # k-means labels: the paper's 10 classes
NUM_RECORDS = 38_551  # the paper's Table 10: 26,986 train + 11,565 test
TEST_FRACTION = 0.3
SEED = 0  # k-means seed; also the seed of the record sample and the test split


def read_purchase(path: Path) -> np.ndarray:
    """The 600 binary features of every record of ``path``, (N, 600) uint8; the label column is dropped.

    Raises:
        DataError: a missing, unreadable or malformed file (a line without 601 integer fields, a feature not 0 / 1).
    """
    if not path.is_file():
        raise DataError(f"{path}: file not found (data.name=purchase reads Shokri et al.'s {FILE_NAME} under data.root)")
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.int16, ndmin=2)  # 1 / 4 of int64's memory
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a comma-separated table of integers ({str(err).splitlines()[0]})") from None
    if table.shape[1] != NUM_FEATURES + 1:
        raise DataError(f"{path}: {table.shape[1]} fields per line, expected {NUM_FEATURES + 1} (the label, then {NUM_FEATURES} features)")
    features = table[:, 1:]
    if not np.isin(features, (0, 1)).all():
        raise DataError(f"{path}: features must be 0 or 1 (line {int(np.flatnonzero(~np.isin(features, (0, 1)).all(1))[0]) + 1})")
    return features.astype(np.uint8)


def kmeans_labels(features: np.ndarray) -> np.ndarray:
    """The labels: k-means (k = 10, seed 0) cluster of each row of ``features`` (N, 600); (N,) int64 in [0, 10)."""
    from sklearn.cluster import KMeans

    if len(features) < NUM_CLUSTERS:
        raise DataError(f"data.name=purchase: {len(features)} records, k-means needs at least {NUM_CLUSTERS}")
    km = KMeans(n_clusters=NUM_CLUSTERS, random_state=SEED, n_init=10).fit(features.astype(np.float32))
    return km.labels_.astype(np.int64)


def as_records(features: np.ndarray) -> Tensor:
    """(N, 600) features → (N, 600, 1, 1) float32, each record a 600-channel 1x1 image."""
    return torch.from_numpy(features).float()[:, :, None, None]


@DATASETS.register("purchase")
def load_purchase(cfg: DictConfig) -> RawDataset:
    """Purchase as built above: k-means labels, 38,551 random records, 30 % test; records as (N, 600, 1, 1) features in {0, 1}."""
    if cfg.image_size is not None:
        raise ConfigError(f"data.image_size={cfg.image_size}: data.name=purchase is tabular (600 features); leave data.image_size null")
    if cfg.root is None:
        raise ConfigError(f"data.name=purchase needs data.root (the folder holding {FILE_NAME})")
    features = read_purchase(Path(cfg.root).expanduser() / FILE_NAME)
    labels = kmeans_labels(features)
    rng = np.random.default_rng(SEED)
    if len(features) < NUM_RECORDS:
        log.info("purchase: the file has %d records, fewer than the paper's %d; using all of them", len(features), NUM_RECORDS)
    rows = rng.permutation(len(features))[:NUM_RECORDS]
    n_test = int(round(len(rows) * TEST_FRACTION))
    test, pool = np.sort(rows[:n_test]), np.sort(rows[n_test:])
    y = torch.from_numpy(labels)
    return RawDataset(
        as_records(features[pool]),
        y[pool],
        test_images=as_records(features[test]),
        test_labels=y[test],
        class_names=[f"cluster{j}" for j in range(NUM_CLUSTERS)],
    )
