"""A public set taken from another dataset than the private data (``data.public_dataset``; Shi et al., PoPETs 2025, §4.1.1:
CIFAR-10 private / CIFAR-100 public, and their Table 8's shifted public sets).

The main dataset is still cut as without it (``data.public_fraction`` of its pool set aside, so the private pool
and its partition are those of the same run with an in-distribution public set, Table 10's 40,000), and that
fifth is dropped; the public set is ``size`` random samples of the other dataset's training split (a choice: the paper does not say which).
Its labels live in another label space, so every public sample is unlabeled (``UNLABELED``): stratified draws
(``protocol.public_stratified``, LDIA's class-balanced D_inf) fall back to uniform ones, training steps that
use public labels skip them, and the attacker sees none.

``data.public_dataset.name=noise`` is no dataset: ``size`` dummy images of uniform noise in [-1, 1] with the private
data's shape, the public set of a server that holds no data like the clients' (the L-Attack's CelebA setting,
Xiao et al., DSN 2024, §VI-A).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from fdattack.data.datasets import DATASETS
from fdattack.data.imageset import SENSITIVE, UNLABELED, ImageSet
from fdattack.errors import ConfigError, FdattackError

KEY = "data.public_dataset"
#: ``data.public_dataset.name`` of the dummy public set: uniform noise images (Xiao et al., DSN 2024, §VI-A)
NOISE = "noise"


def check_public_dataset(cfg: DictConfig) -> None:
    """``data.public_dataset`` names a registered dataset other than ``data.name`` (or ``noise`` with a ``size``), with
    ``data.split=random``.

    Raises:
        ConfigError: naming the offending ``data.public_dataset.*`` key and what is allowed.
    """
    p = cfg.public_dataset
    if p.name is None:
        return
    if p.name == NOISE:
        if p.size is None:
            raise ConfigError(f"{KEY}.name={NOISE} needs {KEY}.size, the number of noise images")
    else:
        DATASETS.get(p.name, f"{KEY}.name")
    if p.name == cfg.name:
        raise ConfigError(
            f"{KEY}.name={p.name!r} is data.name itself; leave it null to cut the public set from the pool (data.public_fraction)"
        )
    if cfg.split != "random":
        raise ConfigError(f"{KEY}.name={p.name!r} needs data.split=random, got data.split={cfg.split}")
    if p.name != NOISE and p.root is not None and not p.download and not Path(p.root).expanduser().is_dir():
        raise ConfigError(f"{KEY}.root={p.root!r}: folder not found (give the folder holding the {p.name} files, or {KEY}.download=true)")


def foreign_public_set(cfg: DictConfig, image_shape: tuple[int, ...], rng: np.random.Generator) -> ImageSet:
    """``data.public_dataset.size`` random samples (without replacement) of its training split, all unlabeled.

    The setting is checked by :func:`check_public_dataset` first (:func:`~fdattack.data.federated.build_split` does).

    Args:
        cfg: the ``data`` node.
        image_shape: (C, H, W) of the main dataset, which the public samples must share.
        rng: the split's generator, drawn from after the main split so that split is unchanged.

    Raises:
        ConfigError: a shape that differs from the main dataset's, or a size larger than its training split.
        DataError: its files are missing or corrupt (the message is prefixed with ``data.public_dataset``).
    """
    p = cfg.public_dataset
    if p.name == NOISE:
        return noise_public_set(int(p.size), image_shape, rng)
    own = {
        "name": p.name,
        "root": p.root,
        "download": p.download,
        "image_size": cfg.image_size if p.image_size is None else p.image_size,
        "max_per_class": None,
        "max_classes": None,
        "second_look_subdir": None,
        "second_look_root": None,
    }
    try:
        raw = DATASETS.get(p.name)(OmegaConf.merge(cfg, own))
    except FdattackError as err:  # the loader named the keys it read: here they are data.public_dataset's
        message = str(err).replace("data.root", f"{KEY}.root").replace("data.download", f"{KEY}.download")
        raise type(err)(f"{KEY}.name={p.name}: {message}") from None
    shape = tuple(raw.images.shape[1:])
    if shape != tuple(image_shape):
        raise ConfigError(
            f"{KEY}.name={p.name} gives samples of shape {shape}, data.name={cfg.name} gives {tuple(image_shape)}; "
            f"set {KEY}.image_size (or data.image_size) so they match"
        )
    n = len(raw.images)
    if p.size is not None and p.size > n:
        raise ConfigError(f"{KEY}.size={p.size}: {p.name} has only {n} training samples")
    rows = np.sort(rng.choice(n, size=n if p.size is None else int(p.size), replace=False))
    index = torch.from_numpy(rows)
    return ImageSet(
        raw.images[index].float(),
        torch.full((len(rows),), UNLABELED, dtype=torch.long),
        torch.full((len(rows),), SENSITIVE, dtype=torch.long),
        index,
    )


def noise_public_set(size: int, image_shape: tuple[int, ...], rng: np.random.Generator) -> ImageSet:
    """``size`` unlabeled images of uniform noise in [-1, 1], drawn from ``rng``: the dummy public set (Xiao et al., DSN 2024, §VI-A)."""
    stream = torch.Generator().manual_seed(int(rng.integers(2**62)))
    images = torch.rand(size, *image_shape, generator=stream) * 2 - 1
    return ImageSet(
        images, torch.full((size,), UNLABELED, dtype=torch.long), torch.full((size,), SENSITIVE, dtype=torch.long), torch.arange(size)
    )
