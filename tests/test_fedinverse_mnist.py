"""FedInverse on real MNIST (fedinverse.md §10.4 check 2: KED-MI recovers about 4 of the 5 private digits): FedAvg on
digits 0-4 of the shared MNIST test set, KED-MI with its GAN on digits 5-9, scored by the evaluation side's SCNN
trained on all ten digits. Shrunk to one round at 16 px (200 images per digit) so that it runs in about a minute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fdattack.cli import main
from fdattack.config import compose
from tests.conftest import REPO, tiny

SMALL_MNIST = ["data=mnist_fedinverse", "data.image_size=16", "data.max_per_class=200", "protocol.num_clients=5", "protocol.fraction=1.0",
               "protocol.rounds=1", "attacks=[kedmi]", "attack.kedmi.gan_width=16", "attack.kedmi.gan_epochs=15", "attack.kedmi.gan_batch_size=64",
               "attack.kedmi.gan_lr=1e-3", "attack.kedmi.iterations=200", "evaluation.inversion.epochs=5"]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_kedmi_recovers_most_private_mnist_digits_far_above_chance(tmp_path: Path) -> None:
    assert main(["run", str(REPO / "conf" / "experiment" / "kedmi_fedavg_digits.yaml"), *tiny(tmp_path), *SMALL_MNIST]) == 0
    last = json.loads((tmp_path / "run" / "rounds.jsonl").read_text().splitlines()[-1])
    assert last["protocol/server_acc"] > 0.8  # FedAvg learned the five private digits
    assert last["attack/kedmi/eval_classifier_accuracy"] > 0.85  # the scorer tells all ten digits apart
    assert last["attack/kedmi/chance"] == pytest.approx(0.2)
    # chance is 1/5, and an image of the attacker's own digits 5-9 is a miss for the ten-way scorer
    assert last["attack/kedmi/top1"] >= 0.6, last


PAPER_SCALE = {"fedinverse_celeba": ("celeba", 64, "vgg16_bn"), "fedinverse_cifar10": ("cifar10", None, "vgg16_bn")}


@pytest.mark.parametrize("experiment", sorted(PAPER_SCALE))
def test_paper_scale_experiments_compose_to_the_papers_settings(tmp_path: Path, experiment: str) -> None:
    """fedinverse.md §3.1-§3.4: K = 5, C = 1, E = 30, B = 64, SGD-Nesterov 0.01, 10 rounds, VGG16-BN over the private classes only."""
    dataset, size, model = PAPER_SCALE[experiment]
    cfg = compose(str(REPO / "conf" / "experiment" / f"{experiment}.yaml"), [f"data.root={tmp_path}"])
    p, d = cfg.protocol, cfg.data
    assert (d.name, d.image_size, d.split, d.label_space, cfg.model.name) == (dataset, size, "classes", "targets", model)
    assert (p.name, p.num_clients, p.fraction, p.local_epochs, p.rounds) == ("fedavg", 5, 1.0, 30, 10)
    assert (p.optim.name, p.optim.lr, p.optim.momentum, p.optim.nesterov, p.optim.weight_decay, p.optim.batch_size) == ("sgd", 0.01, 0.9, True, 1e-4, 64)
    assert list(cfg.attacks) == ["gmi", "kedmi"]
    assert (cfg.attack.gmi.iterations, cfg.attack.gmi.gan_epochs, cfg.attack.kedmi.iterations, cfg.attack.kedmi.gan_epochs) == (3000, 300, 5000, 100)
    if dataset == "celeba":
        assert (d.private_classes, d.max_public, cfg.attack.kedmi.label_batch) == (1000, 30000, 60)
    else:
        assert list(d.public_classes) == [5, 6, 7, 8, 9]
