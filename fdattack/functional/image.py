"""Image metrics shared by every reconstruction attack (Takahashi et al., CVPR 2023, §3.4, §4.1; the SSIM of the authors' code).

All functions take images in the network's [-1, 1] range, shape (N, C, H, W), unless stated.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

#: The paper's SSIM settings (the PLI authors' code): 11x11 Gaussian window, sigma 1.5, data range 2.
PAPER_WINDOW, PAPER_SIGMA, PAPER_DATA_RANGE = 11, 1.5, 2.0


def gaussian_window(size: int = 11, sigma: float = 1.5) -> Tensor:
    """(size, size) normalized Gaussian window: the outer product of :func:`_gaussian_1d`."""
    g = _gaussian_1d(size, sigma)
    return torch.outer(g, g)


def _gaussian_1d(size: int, sigma: float) -> Tensor:
    coords = torch.arange(size, dtype=torch.float64) - size // 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    return g / g.sum()


def _gaussian_filter(x: Tensor, window: int, sigma: float) -> Tensor:
    """Per-channel zero-padded filtering with :func:`gaussian_window`, done separably (rows, then columns).

    Equal to one 2-D convolution with the outer-product window, at 2k instead of k^2 multiplications per pixel.
    """
    c, pad = x.shape[1], window // 2
    g = _gaussian_1d(window, sigma).to(x)
    x = F.conv2d(x, g.view(1, 1, 1, -1).repeat(c, 1, 1, 1), padding=(0, pad), groups=c)
    return F.conv2d(x, g.view(1, 1, -1, 1).repeat(c, 1, 1, 1), padding=(pad, 0), groups=c)


def _to_unit(x: Tensor) -> Tensor:
    """[-1, 1] images to [0, 1] in float64, as the authors' evaluation does before SSIM."""
    return x.double() * 0.5 + 0.5


def _ssim_from_moments(mu_a: Tensor, sq_a: Tensor, mu_b: Tensor, sq_b: Tensor, cross: Tensor, data_range: float) -> Tensor:
    """Mean SSIM over channels and pixels from local means, local second moments and the local cross moment."""
    var_a, var_b, cov = sq_a - mu_a**2, sq_b - mu_b**2, cross - mu_a * mu_b
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    ssim_map = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return ssim_map.flatten(1).mean(dim=1).float()


def paper_ssim(
    a: Tensor, b: Tensor, data_range: float = PAPER_DATA_RANGE, window: int = PAPER_WINDOW, sigma: float = PAPER_SIGMA
) -> Tensor:
    """The PLI evaluation SSIM (Takahashi et al., CVPR 2023, §4.1, as their code computes it): Gaussian 11x11 window,
    sigma 1.5, per channel with zero padding, C1 = (0.01 * data_range)^2, C2 = (0.03 * data_range)^2, averaged over channels and pixels.

    The authors map images to [0, 1] but keep ``data_range = 2``; this function does the same mapping.

    Args:
        a, b: (N, C, H, W) images in [-1, 1] (broadcastable).

    Returns:
        (N,) SSIM per image pair.
    """
    a, b = torch.broadcast_tensors(_to_unit(a), _to_unit(b))

    def filt(x: Tensor) -> Tensor:
        return _gaussian_filter(x, window, sigma)

    return _ssim_from_moments(filt(a), filt(a * a), filt(b), filt(b * b), filt(a * b), data_range)


def standard_ssim(a: Tensor, b: Tensor) -> Tensor:
    """torchmetrics' SSIM on [0, 1] images with data_range 1 (a sanity figure beside the paper's). Returns (N,)."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    a, b = torch.broadcast_tensors(a.float() * 0.5 + 0.5, b.float() * 0.5 + 0.5)
    return structural_similarity_index_measure(a, b, data_range=1.0, reduction="none")  # type: ignore[return-value]


def total_variation(x: Tensor) -> Tensor:
    """TV of Takahashi et al., CVPR 2023, Eq. 11: mean |horizontal diff| + mean |vertical diff| on raw [-1, 1] images. Returns (N,)."""
    dh = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(dim=1)
    dv = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(dim=1)
    return dh + dv


def pairwise_ssim(images: Tensor, references: Tensor, ssim: Callable[[Tensor, Tensor], Tensor] | None = None) -> Tensor:
    """(N, M) SSIM of every image against every reference.

    ``ssim=None`` is :func:`paper_ssim` with its defaults, computed from local moments shared across pairs
    (each image's and each reference's filtered once; only the cross moment is per pair). Any other
    ``ssim(a, b) -> (M,)`` is applied image by image.
    """
    if ssim is not None:
        return torch.stack([ssim(images[i : i + 1].expand_as(references), references) for i in range(images.shape[0])])
    window, sigma, data_range = PAPER_WINDOW, PAPER_SIGMA, PAPER_DATA_RANGE
    images, references = _to_unit(images), _to_unit(references)
    mu_r, sq_r = _gaussian_filter(references, window, sigma), _gaussian_filter(references * references, window, sigma)
    rows = []
    for image in images:
        a = image[None]
        mu_a, sq_a = _gaussian_filter(a, window, sigma), _gaussian_filter(a * a, window, sigma)
        cross = _gaussian_filter(a * references, window, sigma)
        rows.append(_ssim_from_moments(mu_a, sq_a, mu_r, sq_r, cross, data_range))
    return torch.stack(rows) if rows else torch.empty(0, references.shape[0])
