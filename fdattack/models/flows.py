"""A Glow-style normalising flow over a flat latent vector: VMI's variational family (Wu et al., ICLR 2024, §3.1, Eq. 10).

Direction, as in Glow: the flow *encodes* a sample z (here a GAN latent, dimension d) into base noise ε ~ N(0, I_d)
and *decodes* ε into z, so that log q(z) = log N(encode(z); 0, I) + log |det ∂ε/∂z| exactly.

The code's "layeredflow" flows (K steps per level, L levels, additive coupling, actnorm, shuffle) are Glow on a
1×1 "image" of d channels. Glow's squeeze has no meaning there, so the levels are laid out on the flat vector:

- a step is ActNorm → a fixed, seeded shuffle of the coordinates → an additive coupling z_b ← z_b + NN(z_a);
- level i runs its K steps on the first n_i coordinates, n_0 = d and n_{i+1} = ⌊n_i / 2⌋: after every level but the
  last, the trailing half is factored out to the base and left alone (Glow's Split2d, RealNVP's multi-scale). The
  factored-out coordinates get the N(0, I) base itself rather than Glow's learned conditional prior, so that the
  base is N(0, I_d), VMI's prior p_aux of Eq. 10 (d = 512, L = 3: 512, 256, 128 coordinates; d = 100: 100, 50, 25);
- the coupling network is Glow's block on a 1×1 input, i.e. Linear → ReLU → Linear → ReLU → Linear with the last
  layer zero-initialised (every step starts as the identity), hidden width 100 as the code;
- the log-determinant is exact: ActNorm adds its log-scales, shuffles and additive couplings add 0.

Computation is in float64 by default, as the code's ``.double()`` miners.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def standard_normal_log_prob(x: Tensor) -> Tensor:
    """log N(x; 0, I) of each row of (N, d) x: −‖x‖²/2 − (d/2) log 2π, shape (N,)."""
    return -0.5 * x.pow(2).sum(-1) - 0.5 * x.shape[-1] * math.log(2 * math.pi)


class ActNorm(nn.Module):
    """y = (x + b) ⊙ exp(s) per coordinate, log-determinant Σ s.

    Data-dependent initialisation (Glow): the first batch encoded sets b = −mean and s = −log std per coordinate,
    so that this batch leaves with zero mean and unit (population) variance. ``initialized`` is a buffer, so a
    loaded state dict is not initialised again.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))
        self.log_scale = nn.Parameter(torch.zeros(dim))
        self.register_buffer("initialized", torch.tensor(False))

    @torch.no_grad()
    def initialize(self, x: Tensor) -> None:
        """Set b and s from the (N ≥ 2, dim) batch x."""
        if x.shape[0] < 2:
            raise ValueError(f"ActNorm's data-dependent initialisation needs at least 2 samples, got {x.shape[0]}")
        self.bias.copy_(-x.mean(0))
        self.log_scale.copy_(-torch.log(x.std(0, unbiased=False) + 1e-6))
        self.initialized.fill_(True)

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if not self.initialized:
            self.initialize(x)
        return (x + self.bias) * self.log_scale.exp(), self.log_scale.sum().expand(x.shape[0])

    def decode(self, y: Tensor) -> tuple[Tensor, Tensor]:
        return y * (-self.log_scale).exp() - self.bias, -self.log_scale.sum().expand(y.shape[0])


class Shuffle(nn.Module):
    """A fixed random permutation of the coordinates (the code's ``flow_permutation=shuffle``); log-determinant 0."""

    def __init__(self, dim: int, generator: torch.Generator) -> None:
        super().__init__()
        perm = torch.randperm(dim, generator=generator)
        self.register_buffer("perm", perm)
        self.register_buffer("inverse", torch.argsort(perm))

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x[:, self.perm], x.new_zeros(x.shape[0])

    def decode(self, y: Tensor) -> tuple[Tensor, Tensor]:
        return y[:, self.inverse], y.new_zeros(y.shape[0])


class AdditiveCoupling(nn.Module):
    """x_b ← x_b + NN(x_a), x_a the first ⌊dim/2⌋ coordinates and x_b the rest; log-determinant 0.

    NN is Linear → ReLU → Linear → ReLU → Linear, the last layer zero-initialised so that the coupling starts as
    the identity (Glow's Conv2dZeros).
    """

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.split = dim // 2
        last = nn.Linear(hidden, dim - self.split)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.net = nn.Sequential(nn.Linear(self.split, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), last)

    def _shift(self, x: Tensor, sign: int) -> tuple[Tensor, Tensor]:
        a, b = x[:, : self.split], x[:, self.split :]
        return torch.cat([a, b + sign * self.net(a)], dim=1), x.new_zeros(x.shape[0])

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self._shift(x, 1)

    def decode(self, y: Tensor) -> tuple[Tensor, Tensor]:
        return self._shift(y, -1)


class FlowStep(nn.Module):
    """One Glow step on ``dim`` coordinates: ActNorm (if ``actnorm``) → Shuffle → AdditiveCoupling."""

    def __init__(self, dim: int, hidden: int, generator: torch.Generator, actnorm: bool = True) -> None:
        super().__init__()
        self.dim = dim
        layers: list[nn.Module] = [ActNorm(dim)] if actnorm else []
        self.layers = nn.ModuleList([*layers, Shuffle(dim, generator), AdditiveCoupling(dim, hidden)])

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        logdet = x.new_zeros(x.shape[0])
        for layer in self.layers:
            x, ld = layer.encode(x)
            logdet = logdet + ld
        return x, logdet

    def decode(self, y: Tensor) -> tuple[Tensor, Tensor]:
        logdet = y.new_zeros(y.shape[0])
        for layer in reversed(self.layers):
            y, ld = layer.decode(y)
            logdet = logdet + ld
        return y, logdet


class Glow(nn.Module):
    """A Glow-style flow over R^d with an N(0, I_d) base (module docstring; Wu et al., ICLR 2024, Eq. 10).

    Args:
        dim: d, the latent dimension (100 for the GMI/KED-MI generators, 512 for StyleGAN).
        steps_per_level: K (the code's 10).
        levels: L (the code's 3); needs ⌊d / 2^(L−1)⌋ ≥ 2.
        hidden: width of the coupling networks (the code's 100).
        actnorm: ActNorm in every step (the code's default); without it a fresh flow is a permutation of z.
        seed: seeds the shuffles (the networks' weights come from the global RNG).
        dtype: parameter and computation dtype (float64 as the code).
    """

    def __init__(
        self,
        dim: int,
        steps_per_level: int = 10,
        levels: int = 3,
        hidden: int = 100,
        actnorm: bool = True,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        if steps_per_level < 1 or levels < 1:
            raise ValueError(f"a flow needs steps_per_level ≥ 1 and levels ≥ 1, got {steps_per_level} and {levels}")
        sizes = [dim >> level for level in range(levels)]
        if sizes[-1] < 2:
            raise ValueError(f"{levels} levels halve dim={dim} to {sizes[-1]} coordinates; the last level needs ≥ 2")
        self.dim = dim
        generator = torch.Generator().manual_seed(seed)
        self.steps = nn.ModuleList(FlowStep(n, hidden, generator, actnorm) for n in sizes for _ in range(steps_per_level))
        self.to(dtype)

    @property
    def _reference(self) -> Tensor:
        return next(self.parameters())

    @property
    def initialized(self) -> bool:
        """Whether every ActNorm has had its data-dependent initialisation."""
        return all(bool(m.initialized) for m in self.modules() if isinstance(m, ActNorm))

    def encode(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """z (N, d) → (ε (N, d), log |det ∂ε/∂z| (N,)); initialises any ActNorm not yet initialised on the way."""
        h = z.to(self._reference)
        logdet = h.new_zeros(h.shape[0])
        for step in self.steps:
            x, ld = step.encode(h[:, : step.dim])
            h, logdet = torch.cat([x, h[:, step.dim :]], dim=1), logdet + ld
        return h, logdet

    def decode(self, eps: Tensor) -> tuple[Tensor, Tensor]:
        """ε (N, d) → (z (N, d), log |det ∂z/∂ε| (N,)), the exact inverse of :meth:`encode`."""
        if not self.initialized:
            raise RuntimeError("the flow's ActNorm layers are not initialised: call initialize(z) first")
        h = eps.to(self._reference)
        logdet = h.new_zeros(h.shape[0])
        for step in reversed(self.steps):
            x, ld = step.decode(h[:, : step.dim])
            h, logdet = torch.cat([x, h[:, step.dim :]], dim=1), logdet + ld
        return h, logdet

    @torch.no_grad()
    def initialize(self, z: Tensor) -> None:
        """Glow's data-dependent initialisation: each ActNorm is set from the batch z (N ≥ 2, d) as it reaches it."""
        for module in self.modules():
            if isinstance(module, ActNorm):
                module.initialized.fill_(False)
        self.encode(z)

    def log_prob(self, z: Tensor) -> Tensor:
        """log q(z) = log N(ε; 0, I) + log |det ∂ε/∂z| of each row of (N, d) z, shape (N,)."""
        eps, logdet = self.encode(z)
        return standard_normal_log_prob(eps) + logdet

    def sample(self, n: int) -> tuple[Tensor, Tensor]:
        """n samples z ~ q (N, d) and their log q(z) (N,), reparameterised (differentiable in the flow's parameters)."""
        return self.sample_from(torch.randn(n, self.dim, dtype=self._reference.dtype, device=self._reference.device))

    def sample_from(self, eps: Tensor) -> tuple[Tensor, Tensor]:
        """z = decode(ε) and log q(z) = log N(ε; 0, I) − log |det ∂z/∂ε| for given base noise ε (N, d)."""
        z, logdet = self.decode(eps)
        return z, standard_normal_log_prob(eps.to(z)) - logdet
