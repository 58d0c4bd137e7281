"""Translation models A_phi (insensitive look -> sensitive look) for PLI's learned prior (Takahashi et al., CVPR 2023, §3.3, Eq. 9).

Two LightningModules, trained on public data only:

- :class:`CycleGANLitModule` for unpaired looks (masked -> unmasked LFW, young -> adult LAG): two ResNet
  generators, two PatchGAN discriminators, LSGAN + cycle (lambda 3) + identity (lambda 0.5) losses, Adam
  2e-4 with beta1 0.5, an image pool of 50 (the authors' code).
- :class:`RestorerLitModule` for blur, the authors' simplified DeblurGAN-v2: the same generator trained on
  synthetic (degraded, clean) pairs with 0.5 * pixel MSE + 0.001 * LSGAN adversarial loss, Adam 1e-4. The
  VGG19 perceptual term of the original is left out: it needs ImageNet weights (any reasonable
  restorer that raises prior SSIM serves the paper's purpose).

Batches are dicts ``{"a": insensitive (B, C, H, W), "b": sensitive (B, C, H, W)}`` in [-1, 1]. Both use
manual optimisation: ``training_step`` takes the generator and discriminator steps itself
(``self.optimizers()``, ``self.manual_backward``), under a ``lightning.Trainer`` or fdattack's Fabric
engine (:meth:`fdattack.engine.trainer.LocalTrainer.fit_module`).
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from fdattack.lit.modes import eval_mode
from fdattack.models.translation import ImagePool, PatchDiscriminator, ResnetGenerator


def lsgan_loss(scores: Tensor, real: bool) -> Tensor:
    """Least-squares GAN loss: MSE of the patch scores to 1 (real) or 0 (fake)."""
    return F.mse_loss(scores, torch.full_like(scores, 1.0 if real else 0.0))


class TranslationLitModule(L.LightningModule):
    """Shared plumbing: manual optimisation that also runs without a Trainer, and :meth:`translate`."""

    generator: ResnetGenerator

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def _update(self, optimizer: torch.optim.Optimizer, loss: Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        optimizer.step()

    def optimization_step(self, batch: dict[str, Tensor], g_opt: torch.optim.Optimizer, d_opt: torch.optim.Optimizer) -> dict[str, Tensor]:
        """One generator update, then one discriminator update; returns the losses to log. Each subclass defines it."""
        raise NotImplementedError(f"{type(self).__name__} must define optimization_step")

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        g_opt, d_opt = self.optimizers()  # type: ignore[misc]
        losses = self.optimization_step(batch, g_opt, d_opt)
        self.log_dict({f"translation/{k}": v for k, v in losses.items()}, prog_bar=True)

    @torch.no_grad()
    def translate(self, images: Tensor, batch_size: int = 64) -> Tensor:
        """A_phi(x): the insensitive look mapped to the sensitive look, in eval mode."""
        with eval_mode(self):
            return torch.cat([self.generator(chunk.to(self.device)).cpu() for chunk in torch.split(images, batch_size)])

    def forward(self, images: Tensor) -> Tensor:
        return self.generator(images)


class CycleGANLitModule(TranslationLitModule):
    """CycleGAN (Zhu et al. 2017) with the PLI authors' settings; ``generator`` is G_AB = A_phi.

    Args:
        channels, image_size: image shape.
        width: ngf = ndf.
        lr: Adam learning rate (2e-4), beta1 0.5.
        lambda_cycle: weight of both cycle-consistency L1 terms (3.0).
        lambda_identity: identity loss weight, relative to lambda_cycle (0.5).
        pool_size: fake-image history per discriminator (50).
        seed: seed of the image pools.
    """

    def __init__(
        self,
        channels: int,
        image_size: int,
        width: int = 64,
        lr: float = 2e-4,
        lambda_cycle: float = 3.0,
        lambda_identity: float = 0.5,
        pool_size: int = 50,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.generator = ResnetGenerator(channels, image_size, width)
        self.generator_ba = ResnetGenerator(channels, image_size, width)
        self.disc_a = PatchDiscriminator(channels, image_size, width)
        self.disc_b = PatchDiscriminator(channels, image_size, width)
        rng = torch.Generator().manual_seed(seed)
        self.pool_a, self.pool_b = ImagePool(pool_size, rng), ImagePool(pool_size, rng)

    def optimization_step(self, batch: dict[str, Tensor], g_opt: torch.optim.Optimizer, d_opt: torch.optim.Optimizer) -> dict[str, Tensor]:
        """One generator update then one discriminator update; returns the detached losses."""
        a, b = batch["a"], batch["b"]
        lam, lam_id = float(self.hparams.lambda_cycle), float(self.hparams.lambda_identity)
        fake_b, fake_a = self.generator(a), self.generator_ba(b)
        self.disc_a.requires_grad_(False)
        self.disc_b.requires_grad_(False)
        adversarial = lsgan_loss(self.disc_b(fake_b), True) + lsgan_loss(self.disc_a(fake_a), True)
        cycle = F.l1_loss(self.generator_ba(fake_b), a) + F.l1_loss(self.generator(fake_a), b)
        identity = F.l1_loss(self.generator(b), b) + F.l1_loss(self.generator_ba(a), a) if lam_id > 0 else torch.zeros(())
        g_loss = adversarial + lam * cycle + lam * lam_id * identity
        self._update(g_opt, g_loss)
        self.disc_a.requires_grad_(True)
        self.disc_b.requires_grad_(True)
        pooled_b, pooled_a = self.pool_b.query(fake_b), self.pool_a.query(fake_a)
        d_loss = 0.5 * (lsgan_loss(self.disc_b(b), True) + lsgan_loss(self.disc_b(pooled_b), False)) + 0.5 * (
            lsgan_loss(self.disc_a(a), True) + lsgan_loss(self.disc_a(pooled_a), False)
        )
        self._update(d_opt, d_loss)
        return {"g_loss": g_loss.detach(), "d_loss": d_loss.detach(), "cycle": cycle.detach()}

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        lr, betas = self.hparams.lr, (0.5, 0.999)
        generators = list(self.generator.parameters()) + list(self.generator_ba.parameters())
        discriminators = list(self.disc_a.parameters()) + list(self.disc_b.parameters())
        return [torch.optim.Adam(generators, lr=lr, betas=betas), torch.optim.Adam(discriminators, lr=lr, betas=betas)]


class RestorerLitModule(TranslationLitModule):
    """Paired restorer (the authors' simplified DeblurGAN-v2): degraded ``a`` -> clean ``b``.

    Args:
        channels, image_size: image shape.
        width: ngf = ndf.
        lr: Adam learning rate (1e-4).
        pixel_weight: weight of the pixel MSE (0.5).
        adversarial_weight: weight of the LSGAN term (0.001; 0 trains the generator alone).
    """

    def __init__(
        self,
        channels: int,
        image_size: int,
        width: int = 64,
        lr: float = 1e-4,
        pixel_weight: float = 0.5,
        adversarial_weight: float = 0.001,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.generator = ResnetGenerator(channels, image_size, width)
        self.disc = PatchDiscriminator(channels, image_size, width)

    def optimization_step(self, batch: dict[str, Tensor], g_opt: torch.optim.Optimizer, d_opt: torch.optim.Optimizer) -> dict[str, Tensor]:
        """One generator update then (when adversarial) one discriminator update; returns the detached losses."""
        a, b = batch["a"], batch["b"]
        adv_w = float(self.hparams.adversarial_weight)
        restored = self.generator(a)
        pixel = F.mse_loss(restored, b)
        self.disc.requires_grad_(False)
        adversarial = lsgan_loss(self.disc(restored), True) if adv_w > 0 else torch.zeros(())
        g_loss = float(self.hparams.pixel_weight) * pixel + adv_w * adversarial
        self._update(g_opt, g_loss)
        self.disc.requires_grad_(True)
        losses = {"g_loss": g_loss.detach(), "pixel_mse": pixel.detach()}
        if adv_w > 0:
            d_loss = 0.5 * (lsgan_loss(self.disc(b), True) + lsgan_loss(self.disc(restored.detach()), False))
            self._update(d_opt, d_loss)
            losses["d_loss"] = d_loss.detach()
        return losses

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        lr = self.hparams.lr
        return [torch.optim.Adam(self.generator.parameters(), lr=lr), torch.optim.Adam(self.disc.parameters(), lr=lr, betas=(0.5, 0.999))]
