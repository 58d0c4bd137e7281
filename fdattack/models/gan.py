"""GMI's and KED-MI's GAN networks (Wu et al., ICLR 2024, §3.1: Eqs. 4 and 6), for square images of any power-of-two size >= 8.

At 32 px (1 channel) they are the authors' MNIST networks, at 64 px (3 channels) their CelebA ones, layer for layer:

| here | 32 px | 64 px |
|---|---|---|
| :class:`Generator` | ``GeneratorMNIST`` (4→8→16→32) | ``Generator`` (4→8→16→32→64) |
| :class:`DGWGAN` | ``DGWGAN32`` (WGAN-GP critic) | ``DGWGAN`` |
| :class:`MinibatchDiscriminator` | ``MinibatchDiscriminator_MNIST`` (K logits) | ``MinibatchDiscriminator`` |

Other sizes keep the pattern with fewer (or more) up- and down-sampling blocks: every network works from or down to a
4×4 map, one stride-2 block per doubling, so 8 px has one block and 16 px two (fast digits in tests).

The generators end in a sigmoid: images in [0, 1], the range the discriminators are trained on. fdattack's data and
target models use [-1, 1]; :func:`to_signed` (2x − 1) and :func:`to_unit` ((x + 1) / 2) convert (the ranges of the
FedInverse authors' code).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import init


def to_signed(x: Tensor) -> Tensor:
    """[0, 1] → [-1, 1]: a generator's image as a target model (trained on fdattack's data) sees it."""
    return 2 * x - 1


def to_unit(x: Tensor) -> Tensor:
    """[-1, 1] → [0, 1]: fdattack's images in the range of the generators, as the discriminators see them."""
    return (x + 1) / 2


#: the image sizes the networks make and take, in words
SIZES = "square images of a power-of-two size >= 8 (8, 16, 32, 64, ...)"


def valid_size(image_size: int) -> bool:
    """Whether the networks work at ``image_size`` (a power of two >= 8)."""
    return image_size >= 8 and not image_size & (image_size - 1)


def doublings(image_size: int) -> int:
    """How many stride-2 blocks lead from a 4×4 map to ``image_size`` (3 at 32 px, 4 at 64 px).

    Raises:
        ValueError: ``image_size`` is not a power of two >= 8.
    """
    if not valid_size(image_size):
        raise ValueError(f"the GAN networks need {SIZES}; got {image_size}")
    return image_size.bit_length() - 3


def _upsample(c_in: int, c_out: int, bias: bool) -> nn.ConvTranspose2d:
    """ConvTranspose(k5, s2, p2, output_padding 1): doubles the side."""
    return nn.ConvTranspose2d(c_in, c_out, 5, 2, padding=2, output_padding=1, bias=bias)


def _conv_in_lrelu(c_in: int, c_out: int, kernel: int = 5, padding: int = 2) -> nn.Sequential:
    """Conv(stride 2) + InstanceNorm(affine) + LeakyReLU(0.2): halves the side."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, 2, padding), nn.InstanceNorm2d(c_out, affine=True), nn.LeakyReLU(0.2))


class Generator(nn.Module):
    """GMI's generator (also KED-MI's): z (B, z_dim) → images (B, C, S, S) in [0, 1].

    Linear(z_dim → w·2^(n−1)·4·4, no bias) + BN1d + ReLU, reshaped to a 4×4 map; n − 1 × [ConvT(k5, s2, p2, op1, no
    bias) + BN + ReLU] halving the channels down to w; ConvT(w → C, k5, s2, p2, op1) + Sigmoid; n = log2(S / 4).

    Args:
        channels: C.
        image_size: S, a power of two >= 8.
        z_dim: latent size (100 in GMI and KED-MI).
        width: w, the channels of the last hidden map (the code's ``dim``, 64).
    """

    def __init__(self, channels: int, image_size: int, z_dim: int = 100, width: int = 64) -> None:
        super().__init__()
        n = doublings(image_size)
        base = width * 2 ** (n - 1)
        self.z_dim = z_dim
        self.l1 = nn.Sequential(nn.Linear(z_dim, base * 4 * 4, bias=False), nn.BatchNorm1d(base * 4 * 4), nn.ReLU())
        blocks: list[nn.Module] = []
        for i in range(n - 1):
            c_in = base // 2**i
            blocks.append(nn.Sequential(_upsample(c_in, c_in // 2, bias=False), nn.BatchNorm2d(c_in // 2), nn.ReLU()))
        self.l2_5 = nn.Sequential(*blocks, _upsample(width, channels, bias=True), nn.Sigmoid())

    def forward(self, z: Tensor) -> Tensor:
        y = self.l1(z)
        return self.l2_5(y.view(y.shape[0], -1, 4, 4))


class DGWGAN(nn.Module):
    """GMI's WGAN-GP critic: images (B, C, S, S) in [0, 1] → scores (B,).

    Conv(C → w, k5, s2, p2) + LReLU(0.2); n − 1 × [Conv(k5, s2, p2) + InstanceNorm(affine) + LReLU(0.2)] doubling the
    channels; Conv(w·2^(n−1) → 1, k4) on the 4×4 map. Instance norm keeps the score of a sample independent of the rest
    of the batch (the gradient penalty needs that).
    """

    def __init__(self, channels: int, image_size: int, width: int = 64) -> None:
        super().__init__()
        n = doublings(image_size)
        blocks = [_conv_in_lrelu(width * 2**i, width * 2 ** (i + 1)) for i in range(n - 1)]
        self.ls = nn.Sequential(nn.Conv2d(channels, width, 5, 2, 2), nn.LeakyReLU(0.2), *blocks, nn.Conv2d(width * 2 ** (n - 1), 1, 4))

    def forward(self, x: Tensor) -> Tensor:
        return self.ls(x).view(-1)


class MinibatchDiscrimination(nn.Module):
    """Salimans et al.'s minibatch discrimination, as KED-MI's code: M_i = f_i T (B out features × ``kernel_dims``),
    o_ib = Σ_{j≠i} exp(−‖M_ib − M_jb‖₁), returns [f, o] (N, A + B). T ~ N(0, 1)."""

    def __init__(self, in_features: int, out_features: int = 64, kernel_dims: int = 50) -> None:
        super().__init__()
        self.out_features, self.kernel_dims = out_features, kernel_dims
        self.T = nn.Parameter(torch.empty(in_features, out_features, kernel_dims))
        init.normal_(self.T, 0, 1)

    def forward(self, x: Tensor) -> Tensor:
        m = (x @ self.T.flatten(1)).view(-1, self.out_features, self.kernel_dims).transpose(0, 1)  # (B, N, C)
        distances = torch.cdist(m, m, p=1)  # (B, N, N) L1 distances, without the (N, N, B, C) differences
        return torch.cat([x, torch.exp(-distances).sum(dim=2).T - 1], dim=1)  # minus exp(0), the sample itself


class MinibatchDiscriminator(nn.Module):
    """KED-MI's K+1-class discriminator: images (B, C, S, S) in [0, 1] → (features f (B, F), class logits (B, K)).

    Down to 4×4 with [Conv(s2) + InstanceNorm(affine) + LReLU(0.2)] blocks: the first three k5 (p2) with w, 2w, 4w
    channels, any further ones k3 (p1) with 4w (the CelebA network's fourth block); f = the flattened last map (4096
    at 32 and 64 px); minibatch discrimination appends 64 features; Linear(F + 64 → K). The (K+1)-th, fake class is
    implicit in the logits (Wu et al., ICLR 2024, Eq. 6).
    """

    def __init__(self, channels: int, image_size: int, num_classes: int, width: int = 64) -> None:
        super().__init__()
        n = doublings(image_size)
        widths = [width * 2 ** min(i, 2) for i in range(n)]
        blocks = [
            _conv_in_lrelu(c_in, c_out) if i < 3 else _conv_in_lrelu(c_in, c_out, 3, 1)
            for i, (c_in, c_out) in enumerate(zip([channels, *widths[:-1]], widths))
        ]
        self.features = nn.Sequential(*blocks, nn.Flatten())
        self.feature_dim = widths[-1] * 4 * 4
        self.mbd1 = MinibatchDiscrimination(self.feature_dim)
        self.fc_layer = nn.Linear(self.feature_dim + self.mbd1.out_features, num_classes)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        f = self.features(x)
        return f, self.fc_layer(self.mbd1(f))
