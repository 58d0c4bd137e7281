"""Image metrics shared by every reconstruction attack (pli.md §10, §7.6, §13.7).

All functions take images in the network's [-1, 1] range, shape (N, C, H, W), unless stated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def gaussian_window(size: int = 11, sigma: float = 1.5) -> Tensor:
    """(size, size) normalized Gaussian window."""
    coords = torch.arange(size, dtype=torch.float64) - size // 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    return torch.outer(g, g)


def paper_ssim(a: Tensor, b: Tensor, data_range: float = 2.0, window: int = 11, sigma: float = 1.5) -> Tensor:
    """The PLI evaluation SSIM (pli.md §10.1): Gaussian 11x11 window, sigma 1.5, per channel with zero
    padding, C1 = (0.01 * data_range)^2, C2 = (0.03 * data_range)^2, averaged over channels and pixels.

    The authors map images to [0, 1] but keep ``data_range = 2``; this function does the same mapping.

    Args:
        a, b: (N, C, H, W) images in [-1, 1] (broadcastable).

    Returns:
        (N,) SSIM per image pair.
    """
    a, b = torch.broadcast_tensors(a.double() * 0.5 + 0.5, b.double() * 0.5 + 0.5)
    c = a.shape[1]
    w = gaussian_window(window, sigma).to(a)[None, None].repeat(c, 1, 1, 1)
    pad = window // 2

    def filt(x: Tensor) -> Tensor:
        return F.conv2d(x, w, padding=pad, groups=c)

    mu_a, mu_b = filt(a), filt(b)
    var_a = filt(a * a) - mu_a**2
    var_b = filt(b * b) - mu_b**2
    cov = filt(a * b) - mu_a * mu_b
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    ssim_map = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return ssim_map.flatten(1).mean(dim=1).float()


def standard_ssim(a: Tensor, b: Tensor) -> Tensor:
    """torchmetrics' SSIM on [0, 1] images with data_range 1 (the sanity figure of §13.7). Returns (N,)."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    a, b = torch.broadcast_tensors(a.float() * 0.5 + 0.5, b.float() * 0.5 + 0.5)
    return structural_similarity_index_measure(a, b, data_range=1.0, reduction="none")  # type: ignore[return-value]


def total_variation(x: Tensor) -> Tensor:
    """TV of pli.md §7.6: mean |horizontal diff| + mean |vertical diff| on raw [-1, 1] images. Returns (N,)."""
    dh = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(dim=1)
    dv = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(dim=1)
    return dh + dv


def pairwise_ssim(images: Tensor, references: Tensor, ssim=paper_ssim) -> Tensor:  # type: ignore[no-untyped-def]
    """(N, M) SSIM of every image against every reference."""
    return torch.stack([ssim(images[i : i + 1].expand_as(references), references) for i in range(images.shape[0])])
