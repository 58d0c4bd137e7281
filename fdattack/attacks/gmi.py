"""GMI (Zhang et al., CVPR 2020) against FedAvg, with FedInverse's HSIC term (Wu et al., ICLR 2024, §3.1, Eqs. 4-5, and §3.2).

Stage 1: a WGAN-GP prior (:class:`~fdattack.lit.gan.WGANGP`) trained once on the attacker's prior data, target-agnostic,
and cached in the attack's state directory (reused by every round and on resume). Stage 2, every round against the
global model T after the round's aggregation (as the FedInverse code): for each of ``seeds`` restarts, one latent per target label,

    z* = argmin_z  −mean D(G(z)) + λ_id · CE(T(2G(z) − 1), y) [± λ_H · HSIC(x1, x2)]

with the code's hand-written Nesterov momentum on z (:func:`nesterov_step`), z clipped to [−1, 1]. The restarts are
independent, so they run as one batch (S · T latents) whose loss is the sum of the restarts' losses; only the HSIC term
couples samples, and it is taken within each restart's batch, as the code does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.attacks.base import ATTACKS, AttackContext
from fdattack.attacks.gan_inversion import GANInversionAttack, GANInversionSettings, HSICTerm
from fdattack.fd.threat import AttackerView
from fdattack.knobs import knob
from fdattack.lit.gan import WGANGP
from fdattack.models.gan import to_signed
from fdattack.randomness import derive_seed


@dataclass
class GMISettings(GANInversionSettings):
    """GMI's knobs (defaults from the FedInverse code; the paper gives none)."""

    iterations: int = knob(
        3000, "latent-optimisation iterations per batch of target labels and round (the code's config 3000, its script 2000)", ge=1
    )
    lr: float = knob(0.02, "learning rate η of the momentum update of z (the code: 0.02 CelebA, 0.01 MNIST)", gt=0)
    gan_epochs: int = knob(300, "WGAN-GP prior training epochs over the prior data, once per run (the FedInverse code: 300)", ge=0)
    seeds: int = knob(10, "independent restarts, one latent per target label each: the samples per label (the code: 10)", ge=1)
    momentum: float = knob(0.9, "momentum μ of the Nesterov update of z", ge=0, lt=1)
    clip: float = knob(1.0, "z is clipped to [-clip, clip] after every step", gt=0)


def nesterov_step(z: Tensor, v: Tensor, grad: Tensor, lr: float, momentum: float, clip: float) -> tuple[Tensor, Tensor]:
    """One step of GMI's latent update (Eq. 5) as the code writes it: v' = μv − ηg; z' = clip(z − μv + (1 + μ)v', −c,
    c). Returns (z', v')."""
    velocity = momentum * v - lr * grad
    return (z - momentum * v + (1 + momentum) * velocity).clamp(-clip, clip), velocity


def gmi_search(
    generator: nn.Module,
    critic: nn.Module,
    target: nn.Module,
    labels: Tensor,
    z: Tensor,
    steps: Iterable[int],
    *,
    lr: float,
    momentum: float = 0.9,
    clip: float = 1.0,
    lambda_id: float = 100.0,
    hsic: HSICTerm = None,
) -> tuple[Tensor, dict[str, float]]:
    """GMI's latent optimisation (Eq. 5) of S restarts at once (frozen networks in eval mode; G's images in [0, 1]).

    Args:
        labels: (T,) the target label of each column.
        z: (S, T, d) the initial latents.
        steps: one iteration per element (e.g. ``range(3000)``, or a progress bar over it).
        hsic: the signed, weighted HSIC term of one restart's batch of images, or None (the baseline).

    Returns:
        the final latents (S, T, d) and the last iteration's loss terms, averaged over the restarts.
    """
    s, t, d = z.shape
    y = labels.repeat(s)
    v = torch.zeros_like(z)
    terms: dict[str, Tensor] = {}
    for _ in steps:
        z = z.detach().requires_grad_(True)
        x = generator(z.view(s * t, d))
        prior = -critic(x).view(s, t).mean(dim=1)
        identity = F.cross_entropy(target(to_signed(x)), y, reduction="none").view(s, t).mean(dim=1)
        dependence = torch.stack([hsic(batch) for batch in x.view(s, t, *x.shape[1:])]) if hsic is not None else torch.zeros_like(prior)
        total = prior + lambda_id * identity + dependence
        (grad,) = torch.autograd.grad(total.sum(), z)
        with torch.no_grad():
            z, v = nesterov_step(z, v, grad, lr, momentum, clip)
        terms = {"prior_loss": prior, "identity_loss": identity, "hsic_loss": dependence, "total_loss": total}
    return z.detach(), {k: float(v.detach().mean()) for k, v in terms.items()}


@ATTACKS.register("gmi")
class GMIAttack(GANInversionAttack):
    """GMI with the HSIC term: the prior GAN once, the latent search of ``seeds`` restarts every round.

    Restart k starts from z ~ N(0, I) seeded by (run seed, k), the same in every round and for every label batch, as
    the code seeds restart k with k. ``Inversions.images`` holds the restarts' images, (seeds, T, C, H, W).
    """

    name = "gmi"
    Settings = GMISettings

    def __init__(self, view: AttackerView, settings: GMISettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        self.settings: GMISettings = settings

    def gan(self, round: int, target: nn.Module, state: dict[str, Tensor]) -> WGANGP:
        """The WGAN-GP prior (:meth:`~fdattack.attacks.gan_inversion.GANInversionAttack.wgan_prior`), the same every round."""
        return self.wgan_prior()

    def search(
        self, gan: WGANGP, target: nn.Module, labels: Tensor, steps: Iterable[int], round: int, chunk: slice
    ) -> tuple[Tensor, dict[str, float]]:  # type: ignore[override]
        s, count = self.settings, len(self.targets)
        z = torch.stack(
            [
                torch.randn(
                    count, s.z_dim, generator=torch.Generator().manual_seed(derive_seed(self.context.seed, self.name, "restart", k))
                )
                for k in range(s.seeds)
            ]
        )
        return gmi_search(
            gan.generator,
            gan.critic,
            target,
            labels,
            z[:, chunk].to(self.device),
            steps,
            lr=s.lr,
            momentum=s.momentum,
            clip=s.clip,
            lambda_id=s.lambda_id,
            hsic=s.hsic_term(),
        )
