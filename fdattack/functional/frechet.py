"""The Fréchet distance of a small sample to a fixed reference Gaussian, fast enough to bootstrap (Wu et al., ICLR 2024, §4.4).

d² = ‖μ − μ_r‖² + tr Σ + tr Σ_r − 2 tr (Σ_r^{1/2} Σ Σ_r^{1/2})^{1/2}, the FID between N(μ, Σ) of the sample and the
reference N(μ_r, Σ_r). torchmetrics' ``FrechetInceptionDistance`` computes the same number from the eigenvalues of the
D × D product Σ Σ_r for every call; with the reference fixed, Σ_r^{1/2} is taken once, and since a sample of n ≪ D
rows has Σ = XᵀX / (n − 1) (X its centred rows), the non-zero eigenvalues of Σ_r^{1/2} Σ Σ_r^{1/2} are those of the
n × n matrix (X Σ_r^{1/2})(X Σ_r^{1/2})ᵀ / (n − 1); and centring commutes with the product, so the rows are multiplied
by Σ_r^{1/2} once for every bootstrap replicate. A replicate then costs an n × D by D × n product and an n × n
eigendecomposition, not a D × D one (0.7 s for 1,000 replicates of 64 images in 512 features, against 0.46 s for one
torchmetrics call).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class FrechetToReference:
    """d² from samples of features to the reference Gaussian of ``reference`` (N, D) features, in float64.

    Args:
        reference: (N, D) features of the reference images (N ≥ 2).
    """

    def __init__(self, reference: Tensor) -> None:
        reference = reference.double()
        self.mean = reference.mean(dim=0)
        cov = torch.cov(reference.T).reshape(reference.shape[1], reference.shape[1])
        values, vectors = torch.linalg.eigh(cov)
        self.cov_sqrt = (vectors * values.clamp(min=0).sqrt()) @ vectors.T
        self.cov_trace = float(cov.trace())

    def __call__(self, features: Tensor) -> float:
        """d² between the Gaussian of ``features`` (n, D), n ≥ 2, and the reference."""
        return self.of_rows(features)(torch.arange(features.shape[0]))

    def of_rows(self, features: Tensor) -> Callable[[Tensor], float]:
        """``rows -> d²`` of the sample ``features[rows]`` (rows may repeat: a bootstrap replicate), with the product by
        Σ_r^{1/2} taken once for all rows (centring commutes with it)."""
        x = features.double()
        y = x @ self.cov_sqrt

        def distance(rows: Tensor) -> float:
            xb, yb, n = x[rows], y[rows], len(rows)
            mean = xb.mean(dim=0)
            projected = yb - yb.mean(dim=0)
            gram = projected @ projected.T if n <= projected.shape[1] else projected.T @ projected  # the smaller of n × n and D × D
            eigenvalues = torch.linalg.eigvalsh(gram / (n - 1)).clamp(min=0)
            spread = float((xb - mean).square().sum()) / (n - 1)
            return float((mean - self.mean).square().sum()) + spread + self.cov_trace - 2 * float(eigenvalues.sqrt().sum())

        return distance
