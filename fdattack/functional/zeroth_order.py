"""The zeroth-order gradient estimator of the L-Attack (Xiao et al., DSN 2024, §IV-C, Eq. 6; forward differences as MAZE)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor


def unit_sphere_directions(batch: int, m: int, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """(B, m, *shape) directions u ~ Uniform(unit sphere in R^d), d = prod(shape): g ~ N(0, I_d), u = g / ‖g‖₂."""
    g = torch.randn(batch, m, *shape, generator=generator)
    norms = g.flatten(2).norm(dim=-1).clamp_min(torch.finfo(g.dtype).tiny)
    return g / norms.view(batch, m, *([1] * len(shape)))


def forward_difference_gradient(
    loss: Callable[[Tensor], Tensor], x: Tensor, m: int, epsilon: float, generator: torch.Generator
) -> tuple[Tensor, int]:
    """Eq. 6: ∂L/∂x ≈ (1/m) Σ_i d (L(x + ε u_i) − L(x)) / ε · u_i, independently per sample of the batch.

    Args:
        loss: black-box per-sample loss ``(N, *shape) -> (N,)``, called once on every query point.
        x: (B, *shape) the points (e.g. generator outputs).
        m: directions per sample; epsilon: the smoothing factor (0.1 in the paper).
        generator: the directions' random stream.

    Returns:
        The (B, *shape) estimate and the number of query samples it took, B·(m + 1).
    """
    b, shape = x.shape[0], tuple(x.shape[1:])
    d = x[0].numel()
    u = unit_sphere_directions(b, m, shape, generator).to(x.device, x.dtype)
    points = torch.cat([x, (x.unsqueeze(1) + epsilon * u).reshape(b * m, *shape)])
    values = loss(points)
    base, moved = values[:b], values[b:].reshape(b, m)
    weights = d * (moved - base.unsqueeze(1)) / epsilon
    estimate = (weights.view(b, m, *([1] * len(shape))) * u).mean(dim=1)
    return estimate, points.shape[0]
