"""KED-MI (Chen et al., ICCV 2021) against FedAvg, with FedInverse's HSIC term (Wu et al., ICLR 2024, §3.1, Eqs. 6-9, and §3.2).

Stage 1, every round (Algorithm 1's "pretrain G and D with ω_t"): a K+1-class GAN
(:class:`~fdattack.lit.gan.KPlusOneGAN`) trained from scratch on the attacker's prior data with the soft labels of the
round's global model T, cached per round in the attack's state directory (reused on resume). Stage 2: one Gaussian
N(μ_k, diag σ_k²) per target label k, μ and log σ² from 0, Adam,

    L(μ, σ) = mean(softplus(lse(l(x))) − lse(l(x))) + λ_id · CE(T(2x − 1), y) [± λ_H · HSIC(x1, x2)],
    x = G(μ + σ ⊙ ε),  ε ~ N(0, I) drawn afresh every iteration,

with no clamp on z. The result is ``samples`` draws z ~ N(μ, σ²) per label, (samples, T, C, H, W).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.attacks.base import ATTACKS
from fdattack.attacks.gan_inversion import GANInversionAttack, GANInversionSettings, HSICTerm, state_digest
from fdattack.knobs import knob
from fdattack.lit.gan import KPlusOneGAN, real_class_loss
from fdattack.models.gan import to_signed
from fdattack.randomness import derive_seed, seeded


@dataclass
class KEDMISettings(GANInversionSettings):
    """KED-MI's knobs (defaults from the FedInverse code; the paper gives none)."""

    iterations: int = knob(5000, "latent-search iterations per batch of target labels and round (the code's README commands: 5000)", ge=1)
    lr: float = knob(0.02, "Adam learning rate of μ and log σ²", gt=0)
    gan_epochs: int = knob(100, "K+1 GAN training epochs over the prior data, every round (the FedInverse code: 100)", ge=0)
    samples: int = knob(5, "draws z ~ N(μ, σ²) per target label in the result (the code: 5 CelebA, 500 MNIST)", ge=1)
    teacher_batch_stats: bool = knob(
        False,
        "the K+1 GAN's soft labels from the target with BatchNorm on each prior batch's own statistics, as the released code "
        "computes them (its target stays in train mode); false: the target as trained, the paper's fixed model",
    )


class PriorViews:
    """The prior images as KED-MI's three loaders read them in one epoch: ``x`` in the epoch's order, ``x_unlabeled``
    and ``x_moment`` through two more independent shuffles (a :class:`~fdattack.engine.trainer.Batchable`)."""

    def __init__(self, images: Tensor, generator: torch.Generator) -> None:
        self.images = images
        self.unlabeled = torch.randperm(len(images), generator=generator)
        self.moment = torch.randperm(len(images), generator=generator)

    def __len__(self) -> int:
        return len(self.images)

    def batch(self, indices: Tensor) -> dict[str, Tensor]:
        return {
            "x": self.images[indices],
            "x_unlabeled": self.images[self.unlabeled[indices]],
            "x_moment": self.images[self.moment[indices]],
        }


def gaussian_latents(mu: Tensor, log_var: Tensor, count: int, generator: torch.Generator) -> Tensor:
    """(count, T, d) draws μ + exp(½ log σ²) ⊙ ε, ε ~ N(0, I), of the per-label Gaussians (T, d)."""
    eps = torch.randn(count, *mu.shape, generator=generator, device=mu.device)
    return mu + torch.exp(0.5 * log_var) * eps


def kedmi_search(
    generator: nn.Module,
    discriminator: nn.Module,
    target: nn.Module,
    labels: Tensor,
    steps: Iterable[int],
    *,
    z_dim: int,
    lr: float,
    lambda_id: float = 100.0,
    hsic: HSICTerm = None,
    noise: torch.Generator,
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """KED-MI's distributional latent search (Eqs. 8-9) (frozen networks in eval mode; G's images in [0, 1]).

    Args:
        labels: (T,) the target label of each Gaussian.
        steps: one iteration per element.
        hsic: the signed, weighted HSIC term of the batch of images, or None (the baseline).
        noise: the generator of ε, on the networks' device.

    Returns:
        μ and log σ² (T, d), and the last iteration's loss terms.
    """
    mu = torch.zeros(len(labels), z_dim, device=labels.device, requires_grad=True)
    log_var = torch.zeros(len(labels), z_dim, device=labels.device, requires_grad=True)
    optimizer = torch.optim.Adam([mu, log_var], lr=lr)
    terms: dict[str, Tensor] = {}
    for _ in steps:
        x = generator(gaussian_latents(mu, log_var, 1, noise)[0])
        prior = real_class_loss(discriminator(x)[1]).mean()
        identity = F.cross_entropy(target(to_signed(x)), labels)
        dependence = hsic(x) if hsic is not None else torch.zeros_like(prior)
        total = prior + lambda_id * identity + dependence
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()
        terms = {"prior_loss": prior, "identity_loss": identity, "hsic_loss": dependence, "total_loss": total}
    return mu.detach(), log_var.detach(), {k: float(v.detach()) for k, v in terms.items()}


@ATTACKS.register("kedmi")
class KEDMIAttack(GANInversionAttack):
    """KED-MI with the HSIC term: the K+1 GAN of every round, then the Gaussian search and ``samples`` draws per label."""

    name = "kedmi"
    Settings = KEDMISettings

    def gan(self, round: int, target: nn.Module, state: dict[str, Tensor]) -> KPlusOneGAN:
        """This round's K+1 GAN, taught by ``target``: trained from scratch, or restored from the state directory."""
        s, (c, h, _) = self.settings, self.view.image_shape
        seed = derive_seed(self.context.seed, self.name, round, "gan")
        with seeded(seed, self.device):
            module = KPlusOneGAN(
                c, h, target, self.view.num_classes, s.z_dim, s.gan_width, s.gan_lr, s.n_critic, teacher_batch_stats=s.teacher_batch_stats
            )
        module.to(self.device)  # beside the target (already there), so that the engine's set-up finds one device
        images = self.view.prior_data.images  # type: ignore[union-attr]

        def views(epoch: int) -> PriorViews:
            return PriorViews(images, torch.Generator().manual_seed(derive_seed(seed, "views", epoch)))

        variant = ("teacher_batch_stats",) if s.teacher_batch_stats else ()  # in the cache key only when on: older keys stay valid
        return self.cached_gan(
            module, views, seed, f"K+1 GAN of round {round}", round, state_digest(list(state), *state.values()), *variant
        )  # type: ignore[return-value]

    def search(
        self, gan: KPlusOneGAN, target: nn.Module, labels: Tensor, steps: Iterable[int], round: int, chunk: slice
    ) -> tuple[Tensor, dict[str, float]]:  # type: ignore[override]
        s = self.settings
        noise = torch.Generator(device=self.device).manual_seed(derive_seed(self.context.seed, self.name, round, chunk.start))
        mu, log_var, losses = kedmi_search(
            gan.generator,
            gan.discriminator,
            target,
            labels,
            steps,
            z_dim=s.z_dim,
            lr=s.lr,
            lambda_id=s.lambda_id,
            hsic=s.hsic_term(),
            noise=noise,
        )
        return gaussian_latents(mu, log_var, s.samples, noise), losses
