"""Public / private / test splits and the :class:`FederatedData` LightningDataModule."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import lightning as L
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from torch.utils.data import DataLoader

from fdattack.data import partitions
from fdattack.data.datasets import DATASETS, RawDataset
from fdattack.data.domains import DOMAIN_TRANSFORMS
from fdattack.data.imageset import AUXILIARY, SENSITIVE, UNLABELED, ImageSet
from fdattack.data.public import check_public_dataset, foreign_public_set
from fdattack.errors import ConfigError


@dataclass
class FederatedSplit:
    """Everything one simulation needs.

    Attributes:
        public: the public set D_p with per-sample domain flags (0 sensitive D_0, 1 auxiliary D_a).
        private: one private set per client.
        test: held-out test set (labels in the output space).
        attacker: the attacker's own prior data (split=classes), or None.
        num_classes: J, the models' output size.
        target_labels: the private (target) labels, in the output space.
        owner: target label -> owning client (split=pli); empty when labels are not owned.
        image_shape: (C, H, W).
        info: set sizes, for logging.
    """

    public: ImageSet
    private: list[ImageSet]
    test: ImageSet
    attacker: Optional[ImageSet]
    num_classes: int
    target_labels: list[int]
    owner: dict[int, int]
    image_shape: tuple[int, int, int]
    info: dict[str, object] = field(default_factory=dict)


def _set(images: Tensor, labels: Tensor, source: Tensor, domain: int = SENSITIVE) -> ImageSet:
    return ImageSet(images.float(), labels.long(), torch.full((len(labels),), domain, dtype=torch.long), source.long())


def _hold_out(rows: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held-out) rows; at least one row is kept."""
    rows = rng.permutation(rows)
    n_test = min(int(round(len(rows) * fraction)), len(rows) - 1)
    return np.sort(rows[n_test:]), np.sort(rows[:n_test])


def _aux_look(cfg: DictConfig, raw: RawDataset, rows: np.ndarray) -> Tensor:
    if cfg.aux_domain == "second_look":
        if raw.second_look is None:
            raise ConfigError(
                f"data.aux_domain=second_look but data.name={cfg.name} has no second look "
                "(image_folder with data.second_look_subdir or data.second_look_root)"
            )
        return raw.second_look[rows]
    return DOMAIN_TRANSFORMS.get(cfg.aux_domain)(raw.images[rows], cfg.blur_strength)


def _split_pli(cfg: DictConfig, raw: RawDataset, num_clients: int, rng: np.random.Generator) -> FederatedSplit:
    """Takahashi et al., CVPR 2023, §4.1, as their code splits: target labels private (2nd half, sensitive), auxiliary
    look public for every label."""
    if cfg.partition != "disjoint_identities":
        raise ConfigError(f"data.split=pli needs data.partition=disjoint_identities, got {cfg.partition}")
    labels = raw.labels.numpy()
    all_labels = np.unique(labels)
    n_targets = cfg.num_targets if cfg.num_targets is not None else max(len(all_labels) // 2, 1)
    if n_targets >= len(all_labels):
        raise ConfigError(f"data.num_targets={n_targets} must leave some of the {len(all_labels)} labels public")
    targets = np.sort(rng.choice(all_labels, size=n_targets, replace=False))
    chunks = partitions.disjoint_identities(targets, num_clients)
    owner = {int(j): k for k, chunk in enumerate(chunks) for j in chunk}
    second = cfg.aux_domain == "second_look"
    private_rows: list[list[int]] = [[] for _ in range(num_clients)]
    test_rows: list[int] = []
    d0_rows: list[int] = []
    da_rows: list[int] = []
    for j in all_labels:
        rows = rng.permutation(np.flatnonzero(labels == j))
        half = len(rows) // 2
        first, second_half = (rows, rows) if second else (rows[:half], rows[half:])
        if int(j) in owner:
            kept, held = _hold_out(second_half, cfg.test_fraction, rng)
            private_rows[owner[int(j)]].extend(kept.tolist())
            test_rows.extend(held.tolist())
            if cfg.aux_domain != "none":
                da_rows.extend(first.tolist())
        else:
            d0_rows.extend(first.tolist())
            if cfg.aux_domain != "none":
                da_rows.extend(second_half.tolist())
    d0, da = np.sort(np.asarray(d0_rows, dtype=np.int64)), np.sort(np.asarray(da_rows, dtype=np.int64))
    relabel = _label_map(cfg, targets, all_labels)
    public = _set(raw.images[d0], relabel(raw.labels[d0]), torch.as_tensor(d0))
    if len(da):
        public = public.concat(_set(_aux_look(cfg, raw, da), relabel(raw.labels[da]), torch.as_tensor(da), AUXILIARY))
    private = [_set(raw.images[r], relabel(raw.labels[r]), torch.as_tensor(r)) for r in map(np.asarray, private_rows)]
    test = _set(
        raw.images[np.asarray(test_rows, dtype=np.int64)],
        relabel(raw.labels[np.asarray(test_rows, dtype=np.int64)]),
        torch.as_tensor(test_rows, dtype=torch.long),
    )
    if raw.test_images is not None:
        keep = torch.isin(raw.test_labels, torch.as_tensor(targets))  # type: ignore[arg-type]
        extra = _set(raw.test_images[keep], relabel(raw.test_labels[keep]), -1 - torch.nonzero(keep).flatten())  # type: ignore[index]
        test = test.concat(extra)
    out_targets = sorted(int(x) for x in relabel(torch.as_tensor(targets)).tolist())
    out_owner = {int(relabel(torch.tensor([j]))[0]): k for j, k in owner.items()}
    num_classes = len(targets) if cfg.label_space == "targets" else int(all_labels.max()) + 1
    return FederatedSplit(public, private, test, None, num_classes, out_targets, out_owner, tuple(raw.images.shape[1:]))  # type: ignore[arg-type]


def _label_map(cfg: DictConfig, targets: np.ndarray, all_labels: np.ndarray):  # type: ignore[no-untyped-def]
    """``label_space=targets``: targets → 0..n-1 by original id, other labels → -1 (DS-FL's 200 outputs, Takahashi et
    al., CVPR 2023, §4.1)."""
    if cfg.label_space == "all":
        return lambda y: y.long()
    lut = torch.full((int(all_labels.max()) + 1,), UNLABELED, dtype=torch.long)
    lut[torch.as_tensor(targets)] = torch.arange(len(targets))
    return lambda y: lut[y.long()]


def _partition(cfg: DictConfig, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    if cfg.partition == "dirichlet":
        return partitions.dirichlet(labels, num_clients, cfg.dirichlet_alpha, cfg.min_client_size, rng)
    if cfg.partition == "shards":
        return partitions.shards(labels, num_clients, cfg.shards_per_client, rng)
    if cfg.partition == "iid":
        return partitions.iid(len(labels), num_clients, rng)
    if cfg.partition == "two_classes":
        return partitions.two_classes(labels, num_clients, rng)
    raise ConfigError(
        f"data.partition={cfg.partition} needs data.split=pli; with data.split={cfg.split} use dirichlet | shards | iid | two_classes"
    )


def _split_pool(cfg: DictConfig, raw: RawDataset, num_clients: int, rng: np.random.Generator) -> FederatedSplit:
    """split=random (public_fraction of the pool public, or that fraction dropped for ``data.public_dataset``) or
    split=classes (public_classes public)."""
    labels = raw.labels.numpy()
    rows = np.arange(len(labels))
    attacker = None
    if cfg.split == "random":
        perm = rng.permutation(rows)
        n_pub = int(round(len(rows) * cfg.public_fraction))
        pub_rows, pool_rows = np.sort(perm[:n_pub]), np.sort(perm[n_pub:])
    else:
        public_classes = np.asarray(list(cfg.public_classes), dtype=np.int64)
        if not len(public_classes) or not np.isin(public_classes, labels).all():
            raise ConfigError(
                f"data.public_classes={list(cfg.public_classes)} must name labels of the dataset (0..{labels.max()}), "
                "or set data.private_classes"
            )
        is_pub = np.isin(labels, public_classes)
        pub_rows, pool_rows = rows[is_pub], rows[~is_pub]
        if cfg.max_public is not None and len(pub_rows) > cfg.max_public:
            pub_rows = np.sort(rng.choice(pub_rows, size=cfg.max_public, replace=False))
    if raw.test_images is None:
        pool_rows, test_rows = _hold_out(pool_rows, cfg.test_fraction, rng)
        test = _set(raw.images[test_rows], raw.labels[test_rows], torch.as_tensor(test_rows))
    else:
        keep = (
            ~torch.isin(raw.test_labels, torch.as_tensor(list(cfg.public_classes), dtype=torch.long))
            if cfg.split == "classes"
            else torch.ones(len(raw.test_labels), dtype=torch.bool)
        )  # type: ignore[arg-type]
        test = _set(raw.test_images[keep], raw.test_labels[keep], -1 - torch.nonzero(keep).flatten())  # type: ignore[index]
    parts = _partition(cfg, labels[pool_rows], num_clients, rng)
    private = [_set(raw.images[pool_rows[p]], raw.labels[pool_rows[p]], torch.as_tensor(pool_rows[p])) for p in parts]
    public = _set(raw.images[pub_rows], raw.labels[pub_rows], torch.as_tensor(pub_rows))
    if cfg.public_dataset.name is not None:
        public = foreign_public_set(cfg, tuple(raw.images.shape[1:]), rng)
    num_classes = int(labels.max()) + 1
    if cfg.split == "classes":
        attacker = public
        num_classes = _private_classes_only(cfg, labels[pool_rows]) if cfg.label_space == "targets" else num_classes
    return FederatedSplit(
        public, private, test, attacker, num_classes, sorted(np.unique(labels[pool_rows]).tolist()), {}, tuple(raw.images.shape[1:])
    )  # type: ignore[arg-type]


def _private_classes_only(cfg: DictConfig, private_labels: np.ndarray) -> int:
    """J for split=classes with label_space=targets: the models output the private classes only (FedInverse's 5-way
    MNIST model, Wu et al., ICLR 2024, §4.1), which must be the lowest labels so that no label is renumbered."""
    highest = int(private_labels.max())
    if highest >= min(cfg.public_classes):
        raise ConfigError(
            f"data.label_space=targets with data.split=classes needs the public classes above every private label; "
            f"data.public_classes={list(cfg.public_classes)} leaves private label {highest}"
        )
    return highest + 1


def _cap_per_class(raw: RawDataset, cap: int, rng: np.random.Generator) -> RawDataset:
    """At most ``cap`` random images of every label from the pool (the official test split is kept whole)."""
    labels = raw.labels.numpy()
    keep = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == y))[:cap] for y in np.unique(labels)]))
    rows = torch.from_numpy(keep)
    second = None if raw.second_look is None else raw.second_look[rows]
    return dataclasses.replace(raw, images=raw.images[rows], labels=raw.labels[rows], second_look=second)


def _most_frequent_private(cfg: DictConfig, raw: RawDataset) -> tuple[RawDataset, DictConfig]:
    """``data.private_classes=N``: the official test split joins the pool (CelebA's splits share no identity), the N
    labels with the most images become 0..N-1 and the others N.. (each group in label order); the config then names
    those others as ``public_classes``."""
    if len(cfg.public_classes):
        raise ConfigError(f"data.private_classes={cfg.private_classes} chooses the public classes itself; leave data.public_classes empty")
    if raw.test_images is not None:
        raw = dataclasses.replace(
            raw,
            images=torch.cat([raw.images, raw.test_images]),
            labels=torch.cat([raw.labels, raw.test_labels]),  # type: ignore[list-item]
            second_look=None,
            test_images=None,
            test_labels=None,
        )
    counts = torch.bincount(raw.labels)
    present = int((counts > 0).sum())
    if cfg.private_classes >= present:
        raise ConfigError(f"data.private_classes={cfg.private_classes} must leave some of the dataset's {present} labels public")
    by_size = sorted(range(len(counts)), key=lambda y: (-int(counts[y]), y))
    private = sorted(by_size[: cfg.private_classes])
    public = sorted(y for y in by_size[cfg.private_classes :] if counts[y] > 0)
    lut = torch.full((len(counts),), -1, dtype=torch.long)
    lut[torch.as_tensor(private + public)] = torch.arange(len(private) + len(public))
    names = [raw.class_names[y] for y in private + public] if raw.class_names else []
    cfg = cfg.copy()
    cfg.public_classes = list(range(len(private), len(private) + len(public)))
    return dataclasses.replace(raw, labels=lut[raw.labels], class_names=names), cfg


def build_split(cfg: DictConfig, num_clients: int, seed: int) -> FederatedSplit:
    """Load ``cfg.name`` and cut it into public / private-per-client / test, deterministically.

    Raises:
        ConfigError: impossible settings (more clients than identities, an empty client ...).
        DataError: missing or corrupt files.
    """
    check_public_dataset(cfg)
    raw = DATASETS.get(cfg.name)(cfg)
    rng = np.random.default_rng(cfg.seed if cfg.seed is not None else seed)
    if cfg.max_per_class is not None:
        raw = _cap_per_class(raw, cfg.max_per_class, rng)
    if cfg.split == "classes" and cfg.private_classes is not None:
        raw, cfg = _most_frequent_private(cfg, raw)
    split = _split_pli(cfg, raw, num_clients, rng) if cfg.split == "pli" else _split_pool(cfg, raw, num_clients, rng)
    for k, p in enumerate(split.private):
        if len(p) == 0:
            raise ConfigError(
                f"client {k} gets no private samples with protocol.num_clients={num_clients}, data.split={cfg.split}, "
                f"data.partition={cfg.partition}; use fewer clients or more data"
            )
    partitions.assert_disjoint([p.source.numpy() for p in split.private] + [split.test.source[split.test.source >= 0].numpy()])
    split.info = {
        "dataset": cfg.name,
        "J": split.num_classes,
        "public": len(split.public),
        "public_dataset": cfg.public_dataset.name or cfg.name,
        "public_sensitive": int((split.public.domain == SENSITIVE).sum()),
        "public_auxiliary": int((split.public.domain == AUXILIARY).sum()),
        "private_per_client": [len(p) for p in split.private]
        if num_clients <= 10
        else f"{min(len(p) for p in split.private)}..{max(len(p) for p in split.private)}",
        "test": len(split.test),
        "targets": len(split.target_labels),
        "image_shape": list(split.image_shape),
    }
    return split


class FederatedData(L.LightningDataModule):
    """Public set, one private set per client, test set (and attacker prior data) as a LightningDataModule.

    With a plain ``lightning.Trainer`` (``trainer.fit(module, datamodule=data)``, ``test``, ``predict``):
    :meth:`train_dataloader` serves the private set of client :attr:`client`, or all clients' private
    sets pooled when it is None; :meth:`val_dataloader`, :meth:`test_dataloader` and
    :meth:`predict_dataloader` serve the held-out test set (there is no separate validation split).
    Batches are :class:`~fdattack.data.imageset.IndexedBatch` dicts.

    Args:
        cfg: the ``data`` config node (or a :class:`~fdattack.config.DataConfig`).
        num_clients: K.
        seed: split seed used when ``cfg.seed`` is null; also seeds the training loader's shuffling.
        client: whose private set :meth:`train_dataloader` serves (0..K-1); None pools every client's.
        batch_size: mini-batch size of the Trainer's loaders.
    """

    def __init__(self, cfg: DictConfig, num_clients: int, seed: int, client: int | None = None, batch_size: int = 64) -> None:
        super().__init__()
        self.cfg = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
        self.num_clients = num_clients
        self.seed = seed
        self.client = client
        self.batch_size = batch_size
        self._split: FederatedSplit | None = None

    def setup(self, stage: str | None = None) -> None:
        if self._split is None:
            self._split = build_split(self.cfg, self.num_clients, self.seed)

    @property
    def split(self) -> FederatedSplit:
        if self._split is None:
            raise RuntimeError("call FederatedData.setup() first")
        return self._split

    @property
    def num_classes(self) -> int:
        return self.split.num_classes

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.split.image_shape

    @property
    def public(self) -> ImageSet:
        return self.split.public

    @property
    def test(self) -> ImageSet:
        return self.split.test

    def private(self, k: int) -> ImageSet:
        return self.split.private[k]

    def train_dataloader(self) -> DataLoader:
        """Shuffled batches of client :attr:`client`'s private set, or of every client's pooled when it is None."""
        if self.client is not None:
            if not 0 <= self.client < self.num_clients:
                raise ValueError(f"FederatedData.client must be in 0..{self.num_clients - 1} or None, got {self.client}")
            return self.private_dataloader(self.client, self.batch_size, shuffle=True, seed=self.seed)
        pooled = self.split.private[0]
        for private in self.split.private[1:]:
            pooled = pooled.concat(private)
        return pooled.loader(self.batch_size, shuffle=True, seed=self.seed)

    def val_dataloader(self) -> DataLoader:
        """The held-out test set, in order (fdattack has no separate validation split)."""
        return self.test_dataloader()

    def test_dataloader(self) -> DataLoader:
        """The held-out test set, in order."""
        return self.split.test.loader(self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        """The held-out test set, in order (``trainer.predict`` returns its logits batch by batch)."""
        return self.test_dataloader()

    def private_dataloader(self, k: int, batch_size: int = 64, shuffle: bool = True, seed: int = 0) -> DataLoader:
        return self.split.private[k].loader(batch_size, shuffle=shuffle, seed=seed)

    def save_partition(self, path: Path) -> None:
        """Write the source rows of public, test and each client's private set as JSON."""
        s = self.split
        payload = {
            "public": s.public.source.tolist(),
            "public_domain": s.public.domain.tolist(),
            "test": s.test.source.tolist(),
            "private": [p.source.tolist() for p in s.private],
            "target_labels": s.target_labels,
            "owner": {str(j): k for j, k in s.owner.items()},
        }
        path.write_text(json.dumps(payload))
