"""PDA-FD's remaining dataset settings (pdafd.md §7.1, Table 10, A21): CINIC-10's folder layout, Purchase's k-means
labels and splits through the tabular path, and a public set from another dataset (CIFAR-10 private / CIFAR-100
public), unlabeled for the run. Stand-in data only; the experiments' settings are checked with the other paper-scale
ones in test_pdafd_attacks.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from omegaconf import read_write
from PIL import Image
from sklearn.metrics import adjusted_rand_score

from fdattack.cli import main
from fdattack.config import compose
from fdattack.data import UNLABELED, build_split, purchase
from fdattack.data.datasets import DATASETS, to_unit_range
from fdattack.errors import DataError
from fdattack.experiment import Experiment
from fdattack.fd.protocols.base import RoundContext
from tests.conftest import REPO, tiny
from tests.test_bad_input import _one_line

EXPERIMENTS = REPO / "conf" / "experiment"
CINIC = str(EXPERIMENTS / "pdafd_cinic10.yaml")
PURCHASE = str(EXPERIMENTS / "pdafd_purchase.yaml")
CIFAR_100_PUBLIC = str(EXPERIMENTS / "pdafd_cifar10_cifar100.yaml")
QUIET = ["logger.wandb.mode=disabled", "logger.progress=never", "trainer.accelerator=cpu"]


# ------------------------------------------------------------------------------------------- stand-in data
def _write_cinic(root: Path, classes: tuple[str, ...] = ("airplane", "cat", "dog"), train: int = 5, test: int = 3) -> None:
    """``root/{train,valid,test}/<class>/*.png``, 32x32 RGB, pixel values from a fixed generator."""
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("valid", 1), ("test", test)):
        for cls in classes:
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / split / cls / f"{cls}_{i}.png")


def _write_purchase(root: Path, n: int = 400) -> np.ndarray:
    """Shokri et al.'s format (label 1..100, then 600 binary features) around 10 prototypes; returns each row's prototype."""
    rng = np.random.default_rng(1)
    prototypes = rng.random((10, 600)) < 0.2
    cluster = rng.integers(0, 10, n)
    features = (prototypes[cluster] ^ (rng.random((n, 600)) < 0.05)).astype(int)
    root.mkdir(parents=True, exist_ok=True)
    lines = (f"{label}," + ",".join(map(str, row)) for label, row in zip(rng.integers(1, 101, n), features))
    (root / purchase.FILE_NAME).write_text("\n".join(lines) + "\n")
    return cluster


def _fake_cifar(classes: int, seed: int, n_train: int = 50, n_test: int = 20) -> type:
    """A stand-in for a torchvision CIFAR class: ``data`` (N, 32, 32, 3) uint8 and ``targets``, as the real ones."""

    class FakeCifar:
        def __init__(self, root: str, train: bool, download: bool) -> None:
            rng = np.random.default_rng(seed + int(train))
            n = n_train if train else n_test
            self.data = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
            self.targets = [i % classes for i in range(n)]

    return FakeCifar


# ------------------------------------------------------------------------------------------- CINIC-10
def test_cinic10_train_is_the_pool_split_4_to_1_and_test_the_test_set(tmp_path: Path) -> None:
    _write_cinic(tmp_path)
    cfg = compose(CINIC, [f"data.root={tmp_path}", "data.min_client_size=1"])
    split = build_split(cfg.data, 2, 42)
    assert (len(split.public), sum(len(p) for p in split.private), len(split.test)) == (3, 12, 9)  # 15 train 4:1, 9 test
    assert split.image_shape == (3, 32, 32) and split.num_classes == 3
    assert torch.bincount(split.test.labels).tolist() == [3, 3, 3]
    first = np.asarray(Image.open(tmp_path / "test" / "airplane" / "airplane_0.png"))  # test row 0: first class, first file
    assert torch.equal(split.test.images[0], to_unit_range(first).permute(2, 0, 1))
    assert float(split.test.images.min()) >= -1 and float(split.test.images.max()) <= 1


@pytest.mark.parametrize("break_it", ["no_train", "no_test_class", "empty_class"])
def test_cinic10_wrong_layout_is_one_line_naming_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str], break_it: str) -> None:
    _write_cinic(tmp_path)
    if break_it == "no_train":
        missing = tmp_path / "train"
        for f in missing.rglob("*.png"):
            f.unlink()
        for d in sorted(missing.iterdir()):
            d.rmdir()
        missing.rmdir()
    else:
        missing = tmp_path / "test" / "cat"
        for f in missing.glob("*.png"):
            f.unlink()
        if break_it == "no_test_class":
            missing.rmdir()
    _one_line(capsys, ["run", CINIC, f"data.root={tmp_path}", *QUIET, f"output_dir={tmp_path / 'run'}"], str(missing), "CINIC-10 layout")


# ------------------------------------------------------------------------------------------- Purchase
def test_purchase_kmeans_labels_are_deterministic_and_the_sets_have_table_10s_proportions(tmp_path: Path) -> None:
    prototype = _write_purchase(tmp_path)
    cfg = compose(PURCHASE, [f"data.root={tmp_path}", "data.min_client_size=1"])
    raw = DATASETS.get("purchase")(cfg.data)
    again = DATASETS.get("purchase")(cfg.data)
    assert torch.equal(raw.labels, again.labels) and torch.equal(raw.test_labels, again.test_labels)
    assert raw.images.shape == (280, 600, 1, 1) and raw.test_images.shape == (120, 600, 1, 1)  # 30 % test
    labels = torch.cat([raw.labels, raw.test_labels])
    assert 0 <= int(labels.min()) and int(labels.max()) < 10
    assert set(torch.unique(raw.images).tolist()) == {0.0, 1.0}  # binary features as they are
    # the clusters are the prototypes the records were drawn around (the file's order is lost in the shuffle)
    features = np.loadtxt(tmp_path / purchase.FILE_NAME, delimiter=",", dtype=np.int64)[:, 1:]
    row_of = {f.tobytes(): i for i, f in enumerate(features.astype(np.float32))}
    rows = [row_of[x.flatten().numpy().tobytes()] for x in torch.cat([raw.images, raw.test_images])]
    assert adjusted_rand_score(prototype[rows], labels.numpy()) > 0.99
    split = build_split(cfg.data, 10, 42)
    assert (len(split.public), sum(len(p) for p in split.private), len(split.test)) == (56, 224, 120)  # 4:1 of 280


def test_purchase_at_paper_size_gives_table_10s_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """197,324 records in the real file: 38,551 drawn, 11,565 test, then 21,589 private and 5,397 public."""
    rng = np.random.default_rng(0)
    monkeypatch.setattr(purchase, "read_purchase", lambda path: (rng.random((40_000, 600)) < 0.1).astype(np.uint8))
    monkeypatch.setattr(purchase, "kmeans_labels", lambda features: np.arange(len(features)) % 10)  # k-means itself is tested above
    split = build_split(compose(PURCHASE, [f"data.root={tmp_path}"]).data, 10, 42)
    assert (sum(len(p) for p in split.private), len(split.public), len(split.test)) == (21_589, 5_397, 11_565)
    assert split.image_shape == (600, 1, 1) and min(len(p) for p in split.private) >= 64


@pytest.mark.parametrize("problem", ["missing", "columns", "not_binary", "image_size"])
def test_purchase_bad_file_or_setting_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], problem: str) -> None:
    data = tmp_path / "purchase"
    _write_purchase(data, n=20)
    path = data / purchase.FILE_NAME
    extra, named = [], [str(path)]
    if problem == "missing":
        path.unlink()
        named.append("file not found")
    elif problem == "columns":
        path.write_text("\n".join(",".join(line.split(",")[:-1]) for line in path.read_text().splitlines()))
        named.append("600 fields per line, expected 601")
    elif problem == "not_binary":
        lines = path.read_text().splitlines()
        lines[3] = lines[3][: lines[3].rindex(",")] + ",2"
        path.write_text("\n".join(lines))
        named.append("line 4")
    else:
        extra, named = ["data.image_size=32"], ["data.image_size=32", "tabular"]
    _one_line(capsys, ["run", PURCHASE, f"data.root={data}", *extra, *QUIET, f"output_dir={tmp_path / 'run'}"], *named)


def test_purchase_runs_through_ldia_and_distillation_lira_to_the_evaluator(tmp_path: Path) -> None:
    """The tabular path end to end: records as (600, 1, 1) through DS-FL, LDIA, the students and the scoring."""
    _write_purchase(tmp_path / "purchase")
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                PURCHASE,
                f"data.root={tmp_path / 'purchase'}",
                "data.min_client_size=8",
                "protocol.num_clients=2",
                "protocol.rounds=1",
                "protocol.warmup_private_epochs=1",
                "protocol.private_epochs=1",
                "protocol.distill_epochs=1",
                "protocol.public_per_round=40",
                "attacks=[ldia,lira_distill]",
                "attack.lira_distill.students=2",
                "attack.lira_distill.epochs=1",
                *QUIET,
                f"output_dir={out}",
            ]
        )
        == 0
    )
    m = json.loads((out / "metrics.json").read_text())
    assert math.isfinite(m["attack/ldia/kl"]) and 0 <= m["attack/lira_distill/auc"] <= 1
    assert m["attack/lira_distill/clients_scored"] == 2.0 and m["protocol/client_acc_mean"] > 0.3  # 10 clusters: chance 0.1


# ------------------------------------------------------------------------------------------- public set from another dataset
def test_cifar100_public_set_replaces_the_dropped_public_fifth_unlabeled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cifar100 = _fake_cifar(100, seed=7)
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", _fake_cifar(10, seed=3))
    monkeypatch.setattr(torchvision.datasets, "CIFAR100", cifar100)
    common = [f"data.root={tmp_path}", "data.min_client_size=1", "protocol.num_clients=2"]
    cfg = compose(CIFAR_100_PUBLIC, [*common, f"data.public_dataset.root={tmp_path}", "data.public_dataset.size=30"])
    split = build_split(cfg.data, 2, 42)
    own = build_split(compose(CIFAR_100_PUBLIC, [*common, "data.public_dataset.name=null"]).data, 2, 42)
    assert len(split.public) == 30 and bool((split.public.labels == UNLABELED).all())
    expected = to_unit_range(cifar100("", True, False).data[split.public.source.numpy()]).permute(0, 3, 1, 2)
    assert torch.equal(split.public.images, expected)  # CIFAR-100 training images, not CIFAR-10's
    assert len(own.public) == 10 and bool((own.public.labels >= 0).all())
    for mine, theirs in zip(split.private, own.private):  # 40 of 50: the 4:1 cut and its partition are unchanged
        assert torch.equal(mine.source, theirs.source)
    assert sum(len(p) for p in split.private) == 40 and len(split.test) == 20 and split.num_classes == 10


def test_noise_public_set_is_dummy_uniform_images_of_the_private_shape(tmp_path: Path) -> None:
    """lattack.md §2.6 (CelebA): a server without data sends noise; the private cut is that of any foreign public set."""
    noise = ["data.split=random", "data.partition=iid", "data.public_dataset.name=noise", "data.public_dataset.size=25"]
    split = build_split(compose(None, noise).data, 2, 42)
    other = build_split(compose(None, [*noise[:2], "data.public_dataset.name=synthetic", "data.public_dataset.size=25"]).data, 2, 42)
    assert split.public.images.shape == (25, *split.image_shape) and bool((split.public.labels == UNLABELED).all())
    assert -1 <= float(split.public.images.min()) < -0.9 and 0.9 < float(split.public.images.max()) <= 1
    assert abs(float(split.public.images.mean())) < 0.05  # uniform on [-1, 1]
    assert torch.equal(split.public.images, build_split(compose(None, noise).data, 2, 42).public.images)  # seeded by the split
    assert not torch.equal(split.public.images, build_split(compose(None, noise).data, 2, 7).public.images)
    for mine, theirs in zip(split.private, other.private):
        assert torch.equal(mine.source, theirs.source)


def test_unlabeled_public_set_is_drawn_uniformly_and_the_attacker_sees_no_labels(tmp_path: Path) -> None:
    """FedMD grants the server the public labels and the protocol stratifies, yet a foreign public set has none."""
    exp = Experiment(
        compose(
            None,
            [
                *tiny(tmp_path),
                "protocol=fedmd_pdafd",
                "data.split=random",
                "data.partition=iid",
                "data.public_dataset.name=synthetic",
                "data.public_dataset.size=150",
                "protocol.public_per_round=60",
                "protocol.public_stratified=true",
            ],
        )
    )
    try:
        stratified = exp.protocol.public_rows(1)
        with read_write(exp.protocol.cfg):
            exp.protocol.cfg.public_stratified = False
        assert torch.equal(stratified, exp.protocol.public_rows(1))
        assert exp.view.public is not None and bool((exp.view.public.labels == UNLABELED).all())
        assert exp.data.split.info["public_dataset"] == "synthetic"
    finally:
        exp.run_dir.release()


def test_fedmd_skips_its_public_transfer_on_an_unlabeled_public_set(tmp_path: Path) -> None:
    """Cross-entropy on a public set without labels would be NaN with zero gradients: the phase trains nothing."""
    exp = Experiment(
        compose(
            None,
            [
                *tiny(tmp_path),
                "protocol=fedmd",
                "data.split=random",
                "data.partition=iid",
                "data.public_dataset.name=synthetic",
                "data.public_dataset.size=60",
                "protocol.transfer_public_epochs=2",
                "protocol.server_model=false",
                "attacks=[]",
            ],
        )
    )
    try:
        before = [{k: v.clone() for k, v in exp.protocol.clients[k].module.state_dict().items()} for k in range(2)]
        ctx = RoundContext(0, [0, 1])
        exp.protocol._transfer_public(ctx)
        after = [exp.protocol.clients[k].module.state_dict() for k in range(2)]
        assert all(torch.equal(b[name], a[name]) for b, a in zip(before, after) for name in b)
        assert "protocol/transfer_public_loss" not in ctx.metrics
    finally:
        exp.run_dir.release()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["data.public_dataset.name=bogus"], ["data.public_dataset.name='bogus'", "cifar100"]),
        (["data.public_dataset.name=digits"], ["data.public_dataset.name='digits'", "data.name"]),
        (["data.public_dataset.name=synthetic", "data.split=pli"], ["data.public_dataset.name='synthetic'", "data.split=random"]),
        (["data.public_dataset.name=synthetic", "data.public_dataset.size=500"], ["data.public_dataset.size=500", "only 200"]),
        (
            ["data.public_dataset.name=synthetic", "data.public_dataset.image_size=16"],
            ["data.public_dataset.name=synthetic", "(1, 16, 16)", "data.public_dataset.image_size"],
        ),
        (
            ["data.public_dataset.name=cifar100", "data.public_dataset.root=nowhere"],
            ["data.public_dataset.root='nowhere'", "folder not found"],
        ),
        (["data.public_dataset.size=ten"], ["data.public_dataset.size"]),
        (["data.public_dataset.name=noise"], ["data.public_dataset.name=noise", "data.public_dataset.size"]),
    ],
)
def test_bad_public_dataset_settings_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], named: list[str]
) -> None:
    split = [] if "data.split=pli" in overrides else ["data.split=random", "data.partition=iid"]
    _one_line(capsys, ["run", *tiny(tmp_path), *split, *overrides], *named)


def test_public_dataset_errors_name_its_own_keys(tmp_path: Path) -> None:
    cfg = compose(
        None, ["data.split=random", "data.partition=iid", "data.public_dataset.name=cifar100", f"data.public_dataset.root={tmp_path}"]
    )
    with pytest.raises(
        DataError, match=r"data\.public_dataset\.name=cifar100: data\.public_dataset\.root=.*data\.public_dataset\.download=true"
    ):
        build_split(cfg.data, 2, 0)
