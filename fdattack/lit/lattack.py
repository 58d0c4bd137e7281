"""The L-Attack's server-side generator as a LightningModule, trained on zeroth-order gradient estimates
(Xiao et al., DSN 2024, §IV-C, Eqs. 4-6)."""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor

from fdattack.lit.modes import eval_mode
from fdattack.models.gan import to_signed
from fdattack.models.lattack import UpsamplingGenerator

BETAS = (0.5, 0.999)  #: Adam's β of the generator (a choice: Xiao et al., DSN 2024 give none)


class LAttackGenerator(L.LightningModule):
    """G(θ_g): z ~ N(0, I) → images in [-1, 1], the range clients receive public images in (2·sigmoid − 1).

    The victim is a black box, so ∂L/∂x comes from outside as a zeroth-order estimate ĝ (Eq. 6) at x = G(z);
    :meth:`apply_estimate` completes the chain rule ∇_θ L = ĝ · ∂x/∂θ_g (Eq. 5) by autograd and takes one Adam step
    (Eq. 4). Manual optimisation: set it up on fdattack's engine (Fabric) or call it inside a ``training_step`` under a
    ``lightning.Trainer``.

    Args:
        image_shape: (C, H, W), sides multiples of 4.
        z_dim: noise size (100).
        width: channels of the first feature map (:class:`~fdattack.models.lattack.UpsamplingGenerator`; 128 by default, a choice).
        lr: η, Adam's learning rate (1e-3), β = (0.5, 0.999).
    """

    def __init__(self, image_shape: tuple[int, int, int], z_dim: int = 100, width: int = 128, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = UpsamplingGenerator(tuple(image_shape), z_dim, width)  # type: ignore[arg-type]

    def forward(self, z: Tensor) -> Tensor:
        """x = G(z): (B, z_dim) → (B, C, H, W) in [-1, 1]."""
        return to_signed(self.generator(z))

    def noise(self, n: int, generator: torch.Generator) -> Tensor:
        """(n, z_dim) z ~ N(0, I) from ``generator`` (a CPU stream, so that runs reproduce on any device), on the module's device."""
        return torch.randn(n, int(self.hparams.z_dim), generator=generator).to(self.device)

    def apply_estimate(self, x: Tensor, estimate: Tensor) -> None:
        """One generator step (Eqs. 4-5): θ_g ← Adam(θ_g, ∂/∂θ_g mean_b ⟨ĝ_b, x_b⟩), i.e. ``x.backward(ĝ / B)``.

        Args:
            x: (B, C, H, W) G(z), still attached to the generator's graph.
            estimate: (B, C, H, W) ĝ ≈ ∂L/∂x at ``x`` (no graph).
        """
        optimizer = self.optimizers()
        optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
        self.manual_backward(x, gradient=estimate.to(x) / x.shape[0])
        optimizer.step()  # type: ignore[union-attr]

    @torch.no_grad()
    def sample(self, z: Tensor) -> Tensor:
        """G(z) in eval mode (BatchNorm running statistics), for the images the attack returns."""
        with eval_mode(self):
            return self(z.to(self.device))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr, betas=BETAS)
