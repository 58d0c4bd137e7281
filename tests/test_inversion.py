"""The inversion network: the paper's sizes, and the LightningModule learning with a plain Trainer."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from fdattack.lit import InversionLitModule
from fdattack.models import InversionDecoder


def test_decoder_matches_the_paper_at_64px() -> None:
    g = InversionDecoder(2000, 3, 64)
    assert g(torch.rand(2, 2000)).shape == (2, 3, 64, 64)
    # pli.md §4.2: 43.8M parameters for D_in = 2000, 17.6M for D_in = 400
    assert round(sum(p.numel() for p in g.parameters()) / 1e6, 1) == 43.8
    assert round(sum(p.numel() for p in InversionDecoder(400, 3, 64).parameters()) / 1e6, 1) == 17.6
    widths = [m.out_channels for m in g.modules() if isinstance(m, torch.nn.ConvTranspose2d)]
    assert widths == [1024, 512, 256, 128, 3]


def test_decoder_sizes_for_small_and_odd_images() -> None:
    assert InversionDecoder(10, 1, 8)(torch.rand(2, 10)).shape == (2, 1, 8, 8)
    assert InversionDecoder(10, 1, 28)(torch.rand(2, 10)).shape == (2, 1, 28, 28)
    out = InversionDecoder(10, 3, 32)(torch.rand(2, 10))
    assert out.shape == (2, 3, 32, 32) and float(out.abs().max()) <= 1.0


def test_inversion_module_learns_one_hot_to_pattern_with_a_plain_trainer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    patterns = torch.rand(4, 1, 8, 8) * 2 - 1
    labels = torch.arange(4).repeat(16)
    batches = [
        {"input": torch.nn.functional.one_hot(labels[i : i + 8], 4).float(), "x": patterns[labels[i : i + 8]]} for i in range(0, 64, 8)
    ]
    module = InversionLitModule(InversionDecoder(4, 1, 8, max_width=64), lr=3e-3, gamma=0.0)
    probe = torch.eye(4)
    before = torch.nn.functional.mse_loss(module.reconstruct(probe), patterns).item()
    L.Trainer(
        max_epochs=15,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    ).fit(module, DataLoader(batches, batch_size=None))
    after = torch.nn.functional.mse_loss(module.reconstruct(probe), patterns).item()
    assert after < 0.3 * before


def test_eq10_step_uses_only_the_prior() -> None:
    module = InversionLitModule(InversionDecoder(4, 1, 8, max_width=32), gamma=0.5)
    inputs, prior = torch.eye(4), torch.zeros(4, 1, 8, 8)
    expected = 0.5 * torch.nn.functional.mse_loss(module(inputs), prior)
    torch.testing.assert_close(module.loss({"input": inputs, "prior": prior}), expected)
