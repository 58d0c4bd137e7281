"""The classifier LightningModule trains on its own with a plain ``lightning.Trainer``."""

from __future__ import annotations

import lightning as L
import torch

from fdattack.config import DataConfig
from fdattack.data import FederatedData
from fdattack.functional import topk_accuracy
from fdattack.lit import ClassifierLitModule
from fdattack.models import build_classifier


def test_trainer_fit_learns_digits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    data = FederatedData(DataConfig(name="digits", split="random", partition="iid"), num_clients=1, seed=0)
    data.setup()
    module = ClassifierLitModule(build_classifier("pli_cnn", 1, 8, data.num_classes), data.num_classes, lr=3e-3)
    before = topk_accuracy(module(data.test.images), data.test.labels)
    trainer = L.Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, data.private_dataloader(0, batch_size=32, shuffle=True, seed=0), data.test_dataloader())
    after = topk_accuracy(module(data.test.images), data.test.labels)
    assert after > 0.8 > before
    assert module.hparams.lr == 3e-3 and "net" not in module.hparams
