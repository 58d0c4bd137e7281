"""The inversion network as a LightningModule: Eq. 3 on paired probabilities, Eq. 10 on optimal inputs."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.lit.modes import eval_mode


class InversionLitModule(L.LightningModule):
    """Trains an inversion network G (pli.md §7.2, §7.5; TBI §8.1 with ``gamma = 0``).

    Batches are dicts:

    - ``{"input": (B, D), "x": (B, C, H, W)[, "prior": (B, C, H, W)]}``: Eq. 3,
      MSE(G(input), x) + gamma * MSE(G(input), prior) (the prior term only when gamma > 0 and given);
    - ``{"input": (B, D), "prior": (B, C, H, W)}`` without ``x``: Eq. 10, gamma * MSE(G(input), prior).

    Args:
        decoder: the network, e.g. :class:`~fdattack.models.inversion.InversionDecoder`.
        lr, weight_decay: Adam settings (paper: 3e-5, 1e-4).
        gamma: prior weight.
    """

    def __init__(self, decoder: nn.Module, lr: float = 3e-5, weight_decay: float = 1e-4, gamma: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["decoder"])
        self.decoder = decoder

    def forward(self, p: Tensor) -> Tensor:
        return self.decoder(p)

    def loss(self, batch: dict[str, Tensor]) -> Tensor:
        out = self(batch["input"])
        gamma = float(self.hparams.gamma)
        if "x" not in batch:  # Eq. 10
            return gamma * F.mse_loss(out, batch["prior"])
        loss = F.mse_loss(out, batch["x"])
        if gamma > 0 and "prior" in batch:
            loss = loss + gamma * F.mse_loss(out, batch["prior"])
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("inversion/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.log("inversion/val_mse", F.mse_loss(self(batch["input"]), batch["x"]), prog_bar=True)

    @torch.no_grad()
    def reconstruct(self, inputs: Tensor) -> Tensor:
        """G in eval mode (BatchNorm running statistics), as the paper reconstructs (§4.2)."""
        with eval_mode(self):
            return self(inputs.to(self.device))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
