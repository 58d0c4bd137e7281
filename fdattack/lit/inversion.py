"""The inversion network as a LightningModule: Eq. 3 on paired probabilities, Eq. 10 on optimal inputs."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.lit.modes import eval_mode
from fdattack.models.inversion import InversionDecoder


class InversionLitModule(L.LightningModule):
    """Trains an inversion network G (Takahashi et al., CVPR 2023, §3.1 Eqs. 2-3, §3.4 Eq. 10; TBI with ``gamma = 0``).

    Batches are dicts:

    - ``{"input": (B, D), "x": (B, C, H, W)[, "prior": (B, C, H, W)]}``: Eq. 3,
      MSE(G(input), x) + gamma * MSE(G(input), prior) (the prior term only when gamma > 0 and given);
    - ``{"input": (B, D), "prior": (B, C, H, W)}`` without ``x``: Eq. 10, gamma * MSE(G(input), prior).

    ``load_from_checkpoint(path)`` needs no arguments when the decoder is an
    :class:`~fdattack.models.inversion.InversionDecoder` (its constructor arguments are saved with the hyper-parameters);
    any other network must be passed again (``load_from_checkpoint(path, decoder=...)``).

    Args:
        decoder: the network, e.g. :class:`~fdattack.models.inversion.InversionDecoder`; None builds an
            ``InversionDecoder(in_features, out_channels, image_size, max_width)``.
        lr, weight_decay: Adam settings (paper: 3e-5, 1e-4).
        gamma: prior weight.
        in_features, out_channels, image_size, max_width: the decoder's shape, when ``decoder`` is None.
    """

    def __init__(
        self,
        decoder: nn.Module | None = None,
        lr: float = 3e-5,
        weight_decay: float = 1e-4,
        gamma: float = 0.0,
        in_features: int | None = None,
        out_channels: int | None = None,
        image_size: int | None = None,
        max_width: int = 1024,
    ) -> None:
        super().__init__()
        if decoder is None:
            if in_features is None or out_channels is None or image_size is None:
                raise TypeError("InversionLitModule needs a decoder, or in_features, out_channels and image_size to build one")
            decoder = InversionDecoder(in_features, out_channels, image_size, max_width)
        hparams: dict[str, object] = {"lr": lr, "weight_decay": weight_decay, "gamma": gamma}
        if isinstance(decoder, InversionDecoder):
            hparams.update(decoder.init_kwargs)
        self.save_hyperparameters(hparams)
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
        """G in eval mode (BatchNorm running statistics), as the PLI authors' code reconstructs."""
        with eval_mode(self):
            return self(inputs.to(self.device))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
