"""The LightningModules and FederatedData work on their own with a plain ``lightning.Trainer``."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fdattack.config import DataConfig
from fdattack.data import FederatedData
from fdattack.functional import topk_accuracy
from fdattack.lit import ClassifierLitModule, CycleGANLitModule, InversionLitModule, RestorerLitModule
from fdattack.models import InversionDecoder


def trainer(tmp_path: Path, **kwargs: object) -> L.Trainer:
    """A quiet CPU Trainer that writes nothing outside ``tmp_path``."""
    options = dict(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    return L.Trainer(**{**options, **kwargs})  # type: ignore[arg-type]


def digits(**kwargs: object) -> FederatedData:
    data = FederatedData(DataConfig(name="digits", split="random", partition="iid"), num_clients=2, seed=0, **kwargs)  # type: ignore[arg-type]
    data.setup()
    return data


def test_trainer_fit_test_predict_on_the_datamodule(tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = digits(client=0, batch_size=32)
    module = ClassifierLitModule("pli_cnn", data.num_classes, lr=3e-3, in_channels=1, image_size=8)
    before = topk_accuracy(module(data.test.images), data.test.labels)
    t = trainer(tmp_path, max_epochs=5)
    t.fit(module, datamodule=data)
    assert "train/loss" in t.callback_metrics and "val/acc" in t.callback_metrics
    (tested,) = t.test(module, datamodule=data, verbose=False)
    after = topk_accuracy(module(data.test.images), data.test.labels)
    assert tested["test/acc"] == pytest.approx(after, abs=1e-6) and after > 0.8 > before
    logits = torch.cat(t.predict(module, datamodule=data))  # type: ignore[arg-type]
    assert logits.shape == (len(data.test), data.num_classes)
    assert module.hparams.lr == 3e-3 and module.hparams.net == "pli_cnn"


def test_train_dataloader_serves_one_client_or_all_pooled() -> None:
    data = digits(batch_size=50)
    pooled = torch.cat([batch["index"] for batch in data.train_dataloader()])
    assert len(pooled) == len(data.private(0)) + len(data.private(1))
    labels = torch.cat([batch["y"] for batch in data.train_dataloader()])
    assert labels.sort().values.equal(torch.cat([data.private(0).labels, data.private(1).labels]).sort().values)
    data.client = 1
    rows = torch.cat([batch["index"] for batch in data.train_dataloader()])
    assert rows.sort().values.equal(torch.arange(len(data.private(1))))
    assert len(data.val_dataloader().dataset) == len(data.test_dataloader().dataset) == len(data.test)
    data.client = 2
    with pytest.raises(ValueError, match="client must be in 0..1"):
        data.train_dataloader()


def test_tuple_batches_and_unlabeled_rows_left_out_of_loss_and_accuracy(tmp_path: Path) -> None:
    # The "network" passes one-hot logits through: rows 0-2 right, row 3 wrong, rows 4-5 unlabeled (y = -1).
    logits = 5 * torch.eye(3)[torch.tensor([0, 1, 2, 0, 1, 2])]
    y = torch.tensor([0, 1, 2, 1, -1, -1])
    module = ClassifierLitModule(nn.Flatten(), num_classes=3)
    loader = DataLoader(TensorDataset(logits, y), batch_size=6)
    (tested,) = trainer(tmp_path).test(module, loader, verbose=False)
    assert tested["test/acc"] == pytest.approx(3 / 4)
    assert tested["test/loss"] == pytest.approx(float(F.cross_entropy(logits[:4], y[:4])), rel=1e-5)
    (predicted,) = trainer(tmp_path).predict(module, loader)
    assert torch.equal(predicted, logits)  # type: ignore[arg-type]
    assert float(ClassifierLitModule(nn.Flatten(), num_classes=3).training_step((logits, y), 0)) == pytest.approx(
        float(F.cross_entropy(logits[:4], y[:4])), rel=1e-5
    )


def _classifier() -> tuple[L.LightningModule, DataLoader, torch.Tensor]:
    x, y = torch.rand(16, 1, 8, 8) * 2 - 1, torch.randint(0, 4, (16,))
    return ClassifierLitModule("pli_cnn", 4, in_channels=1, image_size=8), DataLoader(TensorDataset(x, y), batch_size=8), x


def _inversion() -> tuple[L.LightningModule, DataLoader, torch.Tensor]:
    p = torch.softmax(torch.randn(16, 6), dim=-1)
    rows = [{"input": p[i], "x": torch.rand(1, 8, 8) * 2 - 1} for i in range(16)]
    return InversionLitModule(InversionDecoder(6, 1, 8, max_width=32), lr=1e-3), DataLoader(rows, batch_size=8), p


def _pairs() -> DataLoader:
    images = torch.rand(8, 2, 1, 8, 8) * 2 - 1
    return DataLoader([{"a": a, "b": b} for a, b in images], batch_size=4)


def _cyclegan() -> tuple[L.LightningModule, DataLoader, torch.Tensor]:
    return CycleGANLitModule(1, 8, width=4, pool_size=2), _pairs(), torch.rand(3, 1, 8, 8)


def _restorer() -> tuple[L.LightningModule, DataLoader, torch.Tensor]:
    return RestorerLitModule(1, 8, width=4, adversarial_weight=0.01), _pairs(), torch.rand(3, 1, 8, 8)


@pytest.mark.parametrize("make", [_classifier, _inversion, _cyclegan, _restorer], ids=lambda f: f.__name__.strip("_"))
def test_load_from_checkpoint_needs_no_network(
    tmp_path: Path, make: Callable[[], tuple[L.LightningModule, DataLoader, torch.Tensor]]
) -> None:
    torch.manual_seed(0)
    module, loader, probe = make()
    t = trainer(tmp_path, max_steps=2)
    t.fit(module, loader)
    t.save_checkpoint(tmp_path / "module.ckpt")
    loaded = type(module).load_from_checkpoint(tmp_path / "module.ckpt", map_location="cpu")
    module.eval()
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(probe), module(probe))
    assert dict(loaded.hparams) == dict(module.hparams)


def test_a_network_given_as_a_module_is_passed_again_on_load(tmp_path: Path) -> None:
    module = InversionLitModule(nn.Sequential(nn.Linear(4, 64), nn.Unflatten(1, (1, 8, 8))), gamma=0.5)
    t = trainer(tmp_path, max_steps=1)
    t.fit(module, DataLoader([{"input": torch.rand(4), "x": torch.rand(1, 8, 8)}], batch_size=1))
    t.save_checkpoint(tmp_path / "module.ckpt")
    with pytest.raises(TypeError, match="needs a decoder"):
        InversionLitModule.load_from_checkpoint(tmp_path / "module.ckpt")
    loaded = InversionLitModule.load_from_checkpoint(
        tmp_path / "module.ckpt", decoder=nn.Sequential(nn.Linear(4, 64), nn.Unflatten(1, (1, 8, 8)))
    )
    assert loaded.hparams.gamma == 0.5 and torch.equal(loaded.decoder[0].weight, module.decoder[0].weight)
