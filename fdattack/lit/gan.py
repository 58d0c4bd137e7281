"""The GANs of GMI and KED-MI as LightningModules (Wu et al., ICLR 2024, §3.1: GMI's Eq. 4, KED-MI's Eqs. 6-7), and their losses.

- :class:`WGANGP`: GMI's target-agnostic prior, a :class:`~fdattack.models.gan.Generator` and a
  :class:`~fdattack.models.gan.DGWGAN` critic trained with the WGAN-GP loss (gradient penalty 10).
- :class:`KPlusOneGAN`: KED-MI's inversion-specific GAN, the same generator and a K+1-class
  :class:`~fdattack.models.gan.MinibatchDiscriminator` trained with soft labels from a frozen target model.

Both use manual optimisation as the authors' loops do: every batch is one discriminator (critic) step, and every
``n_critic``-th one is also a generator step; Adam with β = (0.5, 0.999) for both networks. They train under a
``lightning.Trainer`` or fdattack's Fabric engine (:meth:`fdattack.engine.trainer.LocalTrainer.fit_module`). Batches hold
real images in [-1, 1] (fdattack's range) under ``"x"``; the discriminators see them, like the generators' output, in
[0, 1] (as in the FedInverse authors' code).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.models.gan import DGWGAN, Generator, MinibatchDiscriminator, to_unit

#: what the steps accept: ``{"x": ...}`` (KED-MI also ``"x_unlabeled"``, ``"x_moment"``), a tuple of tensors, or ``x``
Batch = Union[Mapping[str, Tensor], Sequence[Tensor], Tensor]
BETAS = (0.5, 0.999)


# ---------------------------------------------------------------------------------------------------- losses
def gradient_penalty(critic: nn.Module, real: Tensor, fake: Tensor, alpha: Optional[Tensor] = None) -> Tensor:
    """E[(‖∇_x̂ D(x̂)‖₂ − 1)²] at x̂ = real + α (fake − real), α ~ U[0, 1] per sample unless given (shape (B, 1, 1, 1))."""
    if alpha is None:
        alpha = torch.rand(real.shape[0], *([1] * (real.dim() - 1)), device=real.device, dtype=real.dtype)
    mixed = (real + alpha * (fake - real)).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
    return ((grad.flatten(1).norm(2, dim=1) - 1) ** 2).mean()


def critic_loss(real_scores: Tensor, fake_scores: Tensor, penalty: Tensor, gp_weight: float = 10.0) -> Tensor:
    """WGAN-GP critic loss: −(E D(x) − E D(G(z))) + λ_gp · penalty."""
    return -(real_scores.mean() - fake_scores.mean()) + gp_weight * penalty


def supervised_loss(logits: Tensor, target_logits: Tensor) -> Tensor:
    """L_sup: −(1/B) Σ_i Σ_k softmax(T(x_i))_k log softmax(l(x_i))_k, the soft labels of the target model (Eq. 6)."""
    return -(F.softmax(target_logits, dim=1) * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


def fake_class_loss(logits: Tensor) -> Tensor:
    """−log(1 − D(x)) per sample = softplus(lse(l(x))), with D(x) = Z/(Z + 1), Z = Σ_k exp(l_k(x))."""
    return F.softplus(torch.logsumexp(logits, dim=1))


def real_class_loss(logits: Tensor) -> Tensor:
    """−log D(x) per sample = softplus(lse(l(x))) − lse(l(x)): KED-MI's prior term (GAN training and latent search)."""
    lse = torch.logsumexp(logits, dim=1)
    return F.softplus(lse) - lse


def unsupervised_loss(real_logits: Tensor, fake_logits: Tensor) -> Tensor:
    """L_unsup = ½ [E −log D(x') + E −log(1 − D(G(z)))] in the code's softplus/log-sum-exp form."""
    return 0.5 * (real_class_loss(real_logits).mean() + fake_class_loss(fake_logits).mean())


def entropy_sum(logits: Tensor) -> Tensor:
    """H = −Σ_i Σ_k p_ik log p_ik with p = softmax(logits), summed over the batch as the code does (Grandvalet & Bengio)."""
    return -(F.softmax(logits, dim=1) * F.log_softmax(logits, dim=1)).sum()


def feature_matching_loss(real_features: Tensor, fake_features: Tensor, fake_logits: Tensor, entropy_weight: float = 1e-4) -> Tensor:
    """KED-MI's generator loss (Eq. 7 in the FedInverse authors' code's form):
    mean_j |mean_batch f_j(x″) − mean_batch f_j(G(z))| + λ_ent · H."""
    return (real_features.mean(dim=0) - fake_features.mean(dim=0)).abs().mean() + entropy_weight * entropy_sum(fake_logits)


# ---------------------------------------------------------------------------------------------------- modules
@torch.no_grad()
def batch_statistics_logits(net: nn.Module, x: Tensor) -> Tensor:
    """``net(x)`` with every BatchNorm layer normalising by the batch's own statistics (as in train mode), its running
    statistics left as they were and everything else in eval mode: the soft labels of FedInverse's released K+1 GAN,
    whose target is never put in eval mode (``DMI/k+1_gan_fl.py``)."""
    norms = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    buffers = [{k: v.clone() for k, v in m.named_buffers()} for m in norms]
    for m in norms:
        m.train()
    try:
        return net(x)
    finally:
        for m, saved in zip(norms, buffers):
            m.eval()
            for k, v in saved.items():
                getattr(m, k).copy_(v)


def _views(batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
    """(x, x_unlabeled, x_moment) of a batch; a batch without the extra views uses x for them."""
    if isinstance(batch, Tensor):
        return batch, batch, batch
    if isinstance(batch, Mapping):
        x = batch["x"]
        return x, batch.get("x_unlabeled", x), batch.get("x_moment", x)
    x = batch[0]
    return (x, batch[1], batch[2]) if len(batch) >= 3 else (x, x, x)


class ManualGAN(L.LightningModule):
    """What both GANs share: a generator, manual optimisation with a critic-step counter, the networks' weights."""

    generator: Generator
    #: the trained networks (attribute names), what :meth:`networks` saves
    NETWORKS: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.critic_steps = 0  # the code's global `step`, across epochs (a Python int: no device sync per step)

    def forward(self, z: Tensor) -> Tensor:
        """G(z): (B, z_dim) → images in [0, 1]."""
        return self.generator(z)

    def networks(self) -> dict[str, dict[str, Tensor]]:
        """The trained networks' state dicts by name (without a frozen target model's weights)."""
        return {name: getattr(self, name).state_dict() for name in self.NETWORKS}

    def load_networks(self, states: Mapping[str, Mapping[str, Tensor]]) -> None:
        """Restore :meth:`networks`."""
        for name in self.NETWORKS:
            getattr(self, name).load_state_dict(states[name])

    def noise(self, n: int) -> Tensor:
        return torch.randn(n, self.generator.z_dim, device=self.device)

    def _update(self, optimizer: torch.optim.Optimizer, loss: Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        optimizer.step()

    def _generator_turn(self) -> bool:
        """Count a critic step; True every ``n_critic``-th one (the code's ``step % n_critic == 0``)."""
        self.critic_steps += 1
        return self.critic_steps % int(self.hparams.n_critic) == 0

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["critic_steps"] = self.critic_steps

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.critic_steps = int(checkpoint.get("critic_steps", 0))

    def _log(self, losses: dict[str, Tensor]) -> None:
        if self._trainer is not None:  # fdattack's Fabric engine needs no per-step logging (no sync per step)
            self.log_dict({f"gan/{k}": v for k, v in losses.items()}, prog_bar=True)

    def _adam(self, params: Sequence[nn.Parameter] | object) -> torch.optim.Adam:
        return torch.optim.Adam(params, lr=self.hparams.lr, betas=BETAS)  # type: ignore[arg-type]


class WGANGP(ManualGAN):
    """GMI's prior GAN (Wu et al., ICLR 2024, Eq. 4): WGAN-GP with n_critic critic steps per generator step.

    Args:
        channels, image_size: C and S of the images (S a power of two >= 8).
        z_dim: latent size (100).
        width: the networks' base width (the code's ``dim``, 64).
        lr: Adam learning rate of both networks (the FedInverse code: 2e-4 CelebA, 4e-3 MNIST).
        n_critic: critic steps per generator step (5).
        gp_weight: λ_gp (10).
    """

    NETWORKS = ("generator", "critic")

    def __init__(
        self,
        channels: int,
        image_size: int,
        z_dim: int = 100,
        width: int = 64,
        lr: float = 2e-4,
        n_critic: int = 5,
        gp_weight: float = 10.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.generator = Generator(channels, image_size, z_dim, width)
        self.critic = DGWGAN(channels, image_size, width)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        g_opt, d_opt = self.optimizers()  # type: ignore[misc]
        real = to_unit(_views(batch)[0])
        with torch.no_grad():
            fake = self.generator(self.noise(real.shape[0]))
        d_loss = critic_loss(self.critic(real), self.critic(fake), gradient_penalty(self.critic, real, fake), self.hparams.gp_weight)
        self._update(d_opt, d_loss)
        losses = {"d_loss": d_loss.detach()}
        if self._generator_turn():
            self.critic.requires_grad_(False)
            g_loss = -self.critic(self.generator(self.noise(real.shape[0]))).mean()
            self._update(g_opt, g_loss)
            self.critic.requires_grad_(True)
            losses["g_loss"] = g_loss.detach()
        self._log(losses)
        return losses["d_loss"]

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self._adam(self.generator.parameters()), self._adam(self.critic.parameters())]


class KPlusOneGAN(ManualGAN):
    """KED-MI's inversion-specific GAN (Wu et al., ICLR 2024, Eqs. 6-7): a K+1-class discriminator taught by a frozen target model.

    Discriminator step: L_sup on x (soft labels softmax(T(x))) + L_unsup on x′ and G(z). Generator step (every
    ``n_critic``-th): feature matching (L1) between x″ and G(z) + 1e-4 · entropy of D's class posterior on G(z). x, x′,
    x″ are the batch's ``"x"``, ``"x_unlabeled"`` and ``"x_moment"`` (the code's three loaders over the prior data); a
    batch with ``x`` alone uses it for all three.

    Args:
        channels, image_size: C and S of the images (S a power of two >= 8).
        target: the frozen target model, images in [-1, 1] → (B, K) logits; kept in eval mode, never trained, and not
            saved in the hyper-parameters (pass it again to ``load_from_checkpoint``).
        num_classes: K.
        z_dim, width, lr, n_critic: as :class:`WGANGP` (lr 2e-4).
        entropy_weight: λ_ent of the generator loss (1e-4).
        teacher_batch_stats: the soft labels come from the target with BatchNorm on each batch's own statistics
            (:func:`batch_statistics_logits`, the released code), not from the target as trained.
    """

    NETWORKS = ("generator", "discriminator")

    def __init__(
        self,
        channels: int,
        image_size: int,
        target: nn.Module,
        num_classes: int,
        z_dim: int = 100,
        width: int = 64,
        lr: float = 2e-4,
        n_critic: int = 5,
        entropy_weight: float = 1e-4,
        teacher_batch_stats: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["target"])
        self.generator = Generator(channels, image_size, z_dim, width)
        self.discriminator = MinibatchDiscriminator(channels, image_size, num_classes, width)
        self.target = target.requires_grad_(False).eval()

    def train(self, mode: bool = True) -> "KPlusOneGAN":
        """Switch the GAN's mode; the target stays in eval mode."""
        super().train(mode)
        self.target.eval()
        return self

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        g_opt, d_opt = self.optimizers()  # type: ignore[misc]
        x, x_unlabeled, x_moment = _views(batch)
        with torch.no_grad():
            soft = batch_statistics_logits(self.target, x) if self.hparams.teacher_batch_stats else self.target(x)
            fake = self.generator(self.noise(x.shape[0]))
        _, labeled = self.discriminator(to_unit(x))
        _, unlabeled = self.discriminator(to_unit(x_unlabeled))
        _, fake_logits = self.discriminator(fake)
        d_loss = supervised_loss(labeled, soft) + unsupervised_loss(unlabeled, fake_logits)
        self._update(d_opt, d_loss)
        losses = {"d_loss": d_loss.detach()}
        if self._generator_turn():
            self.discriminator.requires_grad_(False)
            fake_features, fake_logits = self.discriminator(self.generator(self.noise(x.shape[0])))
            real_features, _ = self.discriminator(to_unit(x_moment))
            g_loss = feature_matching_loss(real_features, fake_features, fake_logits, self.hparams.entropy_weight)
            self._update(g_opt, g_loss)
            self.discriminator.requires_grad_(True)
            losses["g_loss"] = g_loss.detach()
        self._log(losses)
        return losses["d_loss"]

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self._adam(self.generator.parameters()), self._adam(self.discriminator.parameters())]
