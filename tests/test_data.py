"""Datasets, partitions, domain transforms and splits: hand-computed values and invariants."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from fdattack.config import DataConfig, compose
from fdattack.data import AUXILIARY, SENSITIVE, UNLABELED, box_blur, build_split, partitions
from fdattack.data.datasets import DATASETS, read_idx
from fdattack.errors import ConfigError, DataError
from tests.conftest import REPO, SHARED_DATA


def data_cfg(**kw: object) -> OmegaConf:
    return OmegaConf.structured(DataConfig(**kw))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- domain transform
def test_box_blur_matches_hand_computed_reflect101() -> None:
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    out = box_blur(x, 3)
    # top-left window with reflect-101 borders: rows (1,0,1) x cols (1,0,1) = (5+4+5+1+0+1+5+4+5)/9
    assert out[0, 0, 0, 0].item() == pytest.approx(30 / 9)
    assert out[0, 0, 1, 1].item() == pytest.approx((0 + 1 + 2 + 4 + 5 + 6 + 8 + 9 + 10) / 9)
    assert torch.equal(box_blur(x, 1), x)


# ----------------------------------------------------------------------------- partitions
def test_dirichlet_is_disjoint_covering_and_more_skewed_for_small_alpha() -> None:
    labels = np.repeat(np.arange(10), 100)

    def skew(alpha: float) -> float:
        parts = partitions.dirichlet(labels, 5, alpha, 1, np.random.default_rng(0))
        partitions.assert_disjoint(parts)
        assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
        dists = np.stack([np.bincount(labels[p], minlength=10) / len(p) for p in parts])
        return float(np.abs(dists - 0.1).sum(axis=1).mean())

    assert skew(0.1) > skew(1.0) > skew(100.0)


def _dirichlet_per_client_loop(labels: np.ndarray, num_clients: int, alpha: float, min_size: int, rng: np.random.Generator) -> list:
    """The Dirichlet split as it was written before issue 30 (a Python loop over the clients), the reference of its
    vectorised replacement; the same draws in the same order."""
    n = len(labels)
    while True:
        buckets: list[list[int]] = [[] for _ in range(num_clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(alpha * np.ones(num_clients))
            q = q * np.array([len(b) < n / num_clients for b in buckets])
            q = q / q.sum() if q.sum() > 0 else np.ones(num_clients) / num_clients
            cuts = (np.cumsum(q) * len(idx)).astype(int)[:-1]
            for b, piece in zip(buckets, np.split(idx, cuts)):
                b.extend(piece.tolist())
        if min(len(b) for b in buckets) >= max(min_size, 1):
            return [np.sort(np.asarray(b, dtype=np.int64)) for b in buckets]


@pytest.mark.parametrize(
    ("num_clients", "alpha", "min_size", "seed"), [(7, 0.3, 40, 9), (20, 0.1, 5, 0), (3, 100.0, 1, 1), (50, 1.0, 2, 2)]
)
def test_dirichlet_draws_are_those_of_the_per_client_loop_it_replaced(num_clients: int, alpha: float, min_size: int, seed: int) -> None:
    """The vectorised split gives every client the rows the per-client loop gave (seed 9 needs five draws), so the
    shipped Dirichlet configs split as before."""
    labels = np.repeat(np.arange(10), 50)
    rng, reference_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    parts = partitions.dirichlet(labels, num_clients, alpha, min_size, rng)
    expected = _dirichlet_per_client_loop(labels, num_clients, alpha, min_size, reference_rng)
    assert all(p.dtype == np.int64 and np.array_equal(p, e) for p, e in zip(parts, expected)) and len(parts) == len(expected)
    assert rng.random() == reference_rng.random()  # the same draws, no more


def test_dirichlet_gives_up_after_its_tries_saying_how_close_it_came() -> None:
    labels = np.repeat(np.arange(10), 50)
    with pytest.raises(ConfigError, match=r"no draw in 4 gave every one of the 7 clients .* \(the closest left \d+ short\)"):
        partitions.dirichlet(labels, 7, 0.3, 40, np.random.default_rng(9), max_tries=4)


@pytest.mark.parametrize(
    ("cut", "named"),
    [
        (
            lambda rng: partitions.dirichlet(np.arange(100) % 10, 100_000, 1.0, 1, rng),
            "protocol.num_clients=100000 with data.partition=dirichlet needs at least 100000 private samples (1 per client, "
            "data.min_client_size=1), but the clients' pool has only 100; use fewer clients or a smaller data.min_client_size",
        ),
        (
            lambda rng: partitions.dirichlet(np.arange(100) % 10, 10, 1.0, 11, rng),
            "needs at least 110 private samples (11 per client, data.min_client_size=11)",
        ),
        (
            lambda rng: partitions.iid(100, 101, rng),
            "protocol.num_clients=101 with data.partition=iid needs at least 101 private samples (one per client), but the "
            "clients' pool has only 100",
        ),
        (
            lambda rng: partitions.shards(np.arange(100) % 10, 51, 2, rng),
            "protocol.num_clients=51 with data.partition=shards needs at least 102 private samples",
        ),
        (
            lambda rng: partitions.two_classes(np.arange(100) % 10, 11, rng),
            "protocol.num_clients=11 with data.partition=two_classes needs at least 11 private classes",
        ),
        (
            lambda rng: partitions.disjoint_identities(np.arange(3), 4),
            "protocol.num_clients=4 with data.partition=disjoint_identities needs at least 4 target labels",
        ),
    ],
    ids=["dirichlet", "dirichlet_min_client_size", "iid", "shards", "two_classes", "disjoint_identities"],
)
def test_partitions_refuse_sizes_that_cannot_work_before_any_draw(cut: Callable[[np.random.Generator], object], named: str) -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError) as refused:
        cut(rng)
    message = str(refused.value)
    assert message.startswith("protocol.num_clients=") and named in message and "; use fewer clients or " in message
    assert rng.random() == np.random.default_rng(0).random()  # nothing drawn


def test_shards_give_each_client_at_most_its_shards_labels() -> None:
    labels = np.repeat(np.arange(10), 60)
    parts = partitions.shards(labels, 10, 2, np.random.default_rng(1))
    partitions.assert_disjoint(parts)
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)
    assert sum(len(p) for p in parts) == 600


def test_two_classes_each_class_split_between_its_two_holders() -> None:
    labels = np.repeat(np.arange(4), 10)
    parts = partitions.two_classes(labels, 4, np.random.default_rng(0))
    partitions.assert_disjoint(parts)
    assert [sorted(np.unique(labels[p]).tolist()) for p in parts] == [[0, 1], [1, 2], [2, 3], [0, 3]]
    assert all(len(p) == 10 for p in parts)


def test_the_lattack_data_configs_make_the_specs_class_disjoint_split() -> None:
    """lattack.md §2.6: public = labelled digits 7-9, private 0-6, client k holds k and k+1 mod 7, ten outputs, a test
    set of the private digits; mnist_lattack.yaml cuts MNIST exactly as digits_lattack.yaml cuts the 8x8 digits."""
    cfg = compose(None, ["data=digits_lattack", "protocol.num_clients=7"])
    split = build_split(cfg.data, 7, 0)
    assert set(split.public.labels.tolist()) == {7, 8, 9} and split.num_classes == 10
    assert [sorted(set(p.labels.tolist())) for p in split.private] == [sorted({k, (k + 1) % 7}) for k in range(7)]
    assert set(split.test.labels.tolist()) == set(range(7)) and split.target_labels == list(range(7))
    for k in range(7):  # each digit's images halved between its two holders
        holders = [len(split.private[j].labels[split.private[j].labels == k]) for j in ((k - 1) % 7, k)]
        assert abs(holders[0] - holders[1]) <= 1
    mnist = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "data" / "mnist_lattack.yaml"))
    digits = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "data" / "digits_lattack.yaml"))
    assert {k: v for k, v in mnist.items() if k not in ("name", "root")} == {k: v for k, v in digits.items() if k != "name"}
    assert mnist["name"] == "mnist" and compose(None, ["data=mnist_lattack"]).data.image_size is None  # 28 px, native


# ----------------------------------------------------------------------------- datasets
def _write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    header = struct.pack(">II", magic, array.shape[0]) + (struct.pack(">II", *array.shape[1:]) if array.ndim == 3 else b"")
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_idx_reader_and_truncated_file(tmp_path: Path) -> None:
    images = np.arange(2 * 3 * 3).reshape(2, 3, 3)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images, 2051)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.array([7, 1]), 2049)
    assert np.array_equal(read_idx(tmp_path / "t10k-images-idx3-ubyte.gz"), images)
    raw = DATASETS.get("mnist")(data_cfg(name="mnist", root=str(tmp_path)))
    assert raw.labels.tolist() == [7, 1] and raw.images.shape == (2, 1, 3, 3)
    assert raw.images[0, 0, 0, 0].item() == -1.0 and raw.images[0, 0, 0, 1].item() == pytest.approx(2 / 255 - 1)
    truncated = tmp_path / "t10k-images-idx3-ubyte"
    truncated.write_bytes(struct.pack(">IIII", 2051, 2, 3, 3) + b"\x00" * 5)
    (tmp_path / "t10k-images-idx3-ubyte.gz").unlink()
    with pytest.raises(DataError, match=str(truncated)):
        DATASETS.get("mnist")(data_cfg(name="mnist", root=str(tmp_path)))


def _fake_faces(root: Path, subjects: int = 4, per: int = 4) -> None:
    rng = np.random.default_rng(0)
    for s in range(1, subjects + 1):
        (root / f"s{s}").mkdir(parents=True)
        for i in range(1, per + 1):
            Image.fromarray(rng.integers(0, 255, (12, 10), dtype=np.uint8)).save(root / f"s{s}" / f"{i}.pgm")


def test_att_faces_keeps_the_max_classes_subjects_with_the_most_photos_in_folder_order(tmp_path: Path) -> None:
    _fake_faces(tmp_path, subjects=4, per=2)
    for extra in (1, 3):  # s1 and s3 have a third photo
        Image.fromarray(np.zeros((12, 10), dtype=np.uint8)).save(tmp_path / f"s{extra}" / "3.pgm")
    raw = DATASETS.get("att_faces")(data_cfg(name="att_faces", root=str(tmp_path), image_size=8, max_classes=3))
    assert raw.class_names == ["s1", "s2", "s3"]  # s1, s3 (3 photos), then s2 before s4 on the tie; folder order kept
    assert raw.labels.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]


def test_att_faces_layout_and_corrupt_file(tmp_path: Path) -> None:
    _fake_faces(tmp_path)
    raw = DATASETS.get("att_faces")(data_cfg(name="att_faces", root=str(tmp_path), image_size=8))
    assert raw.images.shape == (16, 1, 8, 8) and raw.labels.tolist() == sorted([0, 1, 2, 3] * 4)
    (tmp_path / "s2" / "3.pgm").write_bytes(b"P5\n10 12\n255\n\x00\x01")
    with pytest.raises(DataError, match=str(tmp_path / "s2" / "3.pgm")):
        DATASETS.get("att_faces")(data_cfg(name="att_faces", root=str(tmp_path)))


@pytest.mark.skipif(not (SHARED_DATA / "att_faces").is_dir(), reason="../shared/data/att_faces is not present")
def test_real_att_faces() -> None:
    raw = DATASETS.get("att_faces")(data_cfg(name="att_faces", root=str(SHARED_DATA / "att_faces")))
    assert raw.images.shape == (400, 1, 112, 92) and raw.num_labels == 40
    assert -1.0 <= float(raw.images.min()) < float(raw.images.max()) <= 1.0


@pytest.mark.skipif(not (SHARED_DATA / "mnist_t10k").is_dir(), reason="../shared/data/mnist_t10k is not present")
def test_real_mnist_test_set_is_the_pool() -> None:
    raw = DATASETS.get("mnist")(data_cfg(name="mnist", root=str(SHARED_DATA / "mnist_t10k")))
    assert raw.images.shape == (10000, 1, 28, 28) and raw.test_images is None
    assert np.bincount(raw.labels.numpy()).tolist()[:2] == [980, 1135]


def test_image_folder_second_look_layouts(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for ident in ("a", "b"):
        for tree in ("clean", "masked"):
            (tmp_path / tree / ident).mkdir(parents=True)
            for name in ("1.jpg", "2.jpg"):
                Image.fromarray(rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)).save(tmp_path / tree / ident / name)
        (tmp_path / "clean" / ident / "y").mkdir()
        Image.fromarray(rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)).save(tmp_path / "clean" / ident / "y" / "young.png")
    parallel = DATASETS.get("image_folder")(
        data_cfg(name="image_folder", root=str(tmp_path / "clean"), second_look_root=str(tmp_path / "masked"))
    )
    assert parallel.images.shape == (4, 3, 6, 6) and parallel.second_look is not None
    masked = np.asarray(Image.open(tmp_path / "masked" / "b" / "2.jpg").convert("RGB"))
    assert torch.allclose(parallel.second_look[3], torch.as_tensor(masked.copy()).permute(2, 0, 1).float() / 255 * 2 - 1)
    subdir = DATASETS.get("image_folder")(data_cfg(name="image_folder", root=str(tmp_path / "clean"), second_look_subdir="y"))
    assert torch.equal(subdir.second_look[0], subdir.second_look[1])  # type: ignore[index]


# ----------------------------------------------------------------------------- splits
def test_pli_split_invariants() -> None:
    split = build_split(data_cfg(name="digits", num_targets=4), num_clients=2, seed=3)
    targets = set(split.target_labels)
    public = split.public
    assert len(targets) == 4 and set(split.owner) == targets and sorted(set(split.owner.values())) == [0, 1]
    # targets appear in public only in the auxiliary look
    is_target = torch.isin(public.labels, torch.tensor(sorted(targets)))
    assert bool((public.domain[is_target] == AUXILIARY).all())
    assert bool((public.domain[~is_target] == SENSITIVE).any())
    # no private row's image is public (in either look), and clients own disjoint labels
    private_rows = set(torch.cat([p.source for p in split.private]).tolist())
    assert private_rows.isdisjoint(set(public.source.tolist()))
    for k, p in enumerate(split.private):
        assert {split.owner[int(y)] for y in p.labels} == {k}
    assert private_rows.isdisjoint(set(split.test.source.tolist()))


def test_pli_split_is_deterministic_and_seeded() -> None:
    a = build_split(data_cfg(name="digits"), 2, seed=1)
    b = build_split(data_cfg(name="digits"), 2, seed=1)
    c = build_split(data_cfg(name="digits"), 2, seed=2)
    assert a.target_labels == b.target_labels and torch.equal(a.public.source, b.public.source)
    assert not torch.equal(a.public.source, c.public.source)


def test_label_space_targets_remaps_and_unlabels() -> None:
    split = build_split(data_cfg(name="digits", num_targets=3, label_space="targets"), 3, seed=0)
    assert split.num_classes == 3 and split.target_labels == [0, 1, 2]
    assert set(split.public.labels.tolist()) == {UNLABELED, 0, 1, 2}
    assert bool((split.public.labels[split.public.domain == SENSITIVE] == UNLABELED).all())


def test_classes_split_gives_the_attacker_the_public_classes() -> None:
    split = build_split(data_cfg(name="digits", split="classes", public_classes=[7, 8, 9], partition="iid"), 3, seed=0)
    assert set(split.public.labels.tolist()) == {7, 8, 9} and split.attacker is split.public
    assert set(torch.cat([p.labels for p in split.private]).tolist()) == set(range(7))
    with pytest.raises(ConfigError, match="data.public_classes"):
        build_split(data_cfg(name="digits", split="classes", public_classes=[42], partition="iid"), 3, seed=0)


def test_private_classes_takes_the_most_frequent_labels_first_and_caps_the_public_set() -> None:
    """Digits per label: 178 182 177 183 181 182 181 179 174 180, so the three largest are 3, then 1 and 5 (a tie)."""
    cfg = data_cfg(
        name="digits", split="classes", private_classes=3, max_public=100, partition="iid", label_space="targets", test_fraction=0.2
    )
    split = build_split(cfg, 2, seed=0)
    assert split.num_classes == 3 and split.target_labels == [0, 1, 2]
    private = torch.bincount(torch.cat([*(p.labels for p in split.private), split.test.labels]), minlength=3)
    assert private.tolist() == [182, 183, 182]  # old labels 1, 3, 5 renumbered in label order
    assert len(split.attacker) == 100 and set(split.attacker.labels.tolist()) <= set(range(3, 10))
    with pytest.raises(ConfigError, match="leave data.public_classes empty"):
        build_split(data_cfg(name="digits", split="classes", private_classes=3, public_classes=[9], partition="iid"), 2, seed=0)
    with pytest.raises(ConfigError, match="must leave some"):
        build_split(data_cfg(name="digits", split="classes", private_classes=10, partition="iid"), 2, seed=0)


def test_classes_split_with_target_label_space_outputs_the_private_classes_only() -> None:
    split = build_split(
        data_cfg(name="digits", split="classes", public_classes=[5, 6, 7, 8, 9], partition="iid", label_space="targets"), 3, seed=0
    )
    assert split.num_classes == 5 and split.target_labels == [0, 1, 2, 3, 4]
    assert set(split.attacker.labels.tolist()) == {5, 6, 7, 8, 9}  # the auxiliary classes keep their labels
    with pytest.raises(ConfigError, match="public classes above every private label"):
        build_split(data_cfg(name="digits", split="classes", public_classes=[0, 1], partition="iid", label_space="targets"), 3, seed=0)


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "fashion_mnist", "celeba"])
def test_torchvision_dataset_missing_without_download_is_a_data_error(tmp_path: Path, name: str) -> None:
    with pytest.raises(DataError, match="data.download=true"):
        DATASETS.get(name)(data_cfg(name=name, root=str(tmp_path)))


def test_max_per_class_caps_every_label_of_the_pool() -> None:
    from fdattack.config import compose
    from fdattack.data.federated import build_split

    cfg = compose(None, ["data.max_per_class=20", "data.split=random", "data.partition=iid", "attacks=[ldia]"])
    split = build_split(cfg.data, 2, 0)
    labels = torch.cat([split.public.labels, split.test.labels, *[p.labels for p in split.private]])
    assert torch.bincount(labels).tolist() == [20] * 10  # digits has >= 174 of each
    sources = torch.cat([split.public.source, split.test.source, *[p.source for p in split.private]])
    assert len(set(sources.tolist())) == 200  # distinct pool rows, none duplicated
