"""Networks of the translation model A_phi behind PLI's learned prior (Takahashi et al., CVPR 2023, §3.3, §4.1; the
networks of the authors' code).

The authors use CycleGAN's ResNet generator with 3 residual blocks for both CycleGAN (unpaired looks)
and their simplified DeblurGAN-v2 (blur), and a PatchGAN discriminator. Both are sized here for any
image side: fewer down-sampling stages and discriminator layers for small images.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def _init_normal(module: nn.Module) -> None:
    """CycleGAN's N(0, 0.02) initialisation of conv weights."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class ResidualBlock(nn.Module):
    """Reflection-padded 3x3 conv, instance norm, ReLU, conv, instance norm, plus the identity."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.ReflectionPad2d(1),
            nn.Conv2d(width, width, 3),
            nn.InstanceNorm2d(width),
            nn.ReLU(inplace=True),
            nn.ReflectionPad2d(1),
            nn.Conv2d(width, width, 3),
            nn.InstanceNorm2d(width),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


def generator_downsamplings(image_size: int) -> int:
    """Two stride-2 stages as in CycleGAN from 16 pixels up, one below (an 8x8 digit keeps a 4x4 core)."""
    return 2 if image_size >= 16 else 1


class ResnetGenerator(nn.Module):
    """CycleGAN's ``resnet_3blocks`` generator: image (B, C, S, S) in [-1, 1] -> image of the same shape.

    Args:
        channels: C.
        image_size: S (chooses the number of down-sampling stages).
        width: ngf, the first stage's channels (64 in the paper's code).
        blocks: residual blocks at the bottleneck (3 in the code).
    """

    def __init__(self, channels: int, image_size: int, width: int = 64, blocks: int = 3) -> None:
        super().__init__()
        stages = generator_downsamplings(image_size)
        pad = min(3, image_size - 1)
        layers: list[nn.Module] = [
            nn.ReflectionPad2d(pad),
            nn.Conv2d(channels, width, 2 * pad + 1),
            nn.InstanceNorm2d(width),
            nn.ReLU(True),
        ]
        w = width
        for _ in range(stages):
            layers += [nn.Conv2d(w, 2 * w, 3, 2, 1), nn.InstanceNorm2d(2 * w), nn.ReLU(True)]
            w *= 2
        layers += [ResidualBlock(w) for _ in range(blocks)]
        for _ in range(stages):
            layers += [nn.ConvTranspose2d(w, w // 2, 3, 2, 1, output_padding=1), nn.InstanceNorm2d(w // 2), nn.ReLU(True)]
            w //= 2
        layers += [nn.ReflectionPad2d(pad), nn.Conv2d(w, channels, 2 * pad + 1), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        self.apply(_init_normal)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class PatchDiscriminator(nn.Module):
    """PatchGAN discriminator: image (B, C, S, S) -> (B, 1, s, s) real/fake scores per patch.

    Args:
        channels: C.
        image_size: S; the paper's 3 stride-2 layers from 64 pixels up, fewer below so a patch map remains.
        width: ndf (64 in the code).
    """

    def __init__(self, channels: int, image_size: int, width: int = 64) -> None:
        super().__init__()
        n_layers = min(3, max(1, int(math.log2(image_size)) - 3))
        layers: list[nn.Module] = [nn.Conv2d(channels, width, 4, 2, 1), nn.LeakyReLU(0.2, True)]
        w = width
        for _ in range(1, n_layers):
            layers += [nn.Conv2d(w, 2 * w, 4, 2, 1), nn.InstanceNorm2d(2 * w), nn.LeakyReLU(0.2, True)]
            w *= 2
        layers += [nn.Conv2d(w, 2 * w, 4, 1, 1), nn.InstanceNorm2d(2 * w), nn.LeakyReLU(0.2, True), nn.Conv2d(2 * w, 1, 4, 1, 1)]
        self.net = nn.Sequential(*layers)
        self.apply(_init_normal)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class ImagePool:
    """CycleGAN's history of generated images (Shrivastava et al.): with probability 1/2 a fake is
    swapped for an older one before it reaches the discriminator.

    Args:
        size: images kept (50 in CycleGAN; 0 disables the pool).
        generator: random source of the swaps.
    """

    def __init__(self, size: int, generator: torch.Generator) -> None:
        self.size = size
        self.generator = generator
        self.images: list[Tensor] = []

    def query(self, fakes: Tensor) -> Tensor:
        if self.size == 0:
            return fakes
        out = []
        for image in fakes.detach():
            if len(self.images) < self.size:
                self.images.append(image)
                out.append(image)
            elif torch.rand((), generator=self.generator) < 0.5:
                i = int(torch.randint(self.size, (), generator=self.generator))
                out.append(self.images[i])
                self.images[i] = image
            else:
                out.append(image)
        return torch.stack(out)
