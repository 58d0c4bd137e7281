"""The inversion network G of TBI / PLI ("Code 2", Takahashi et al., CVPR 2023, App. B), sized for any image."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn


class InversionDecoder(nn.Module):
    """Probability vector (B, D) → image (B, C, S, S) in [-1, 1].

    ConvTranspose(D, w0, 4) to 4x4, then stride-2 ConvTranspose stages (BatchNorm + Tanh) doubling the side
    until it reaches S (the last stage outputs C channels with Tanh). At 64x64 this is exactly the
    paper's 1024-512-256-128 network; smaller images use fewer stages (width 128 * 2^(stages-1), capped
    at ``max_width``). Sides that are not 4 * 2^n are produced at the next such size and resized.

    Args:
        in_features: D (J for TBI, 2J for PLI's [p0, pk]).
        out_channels: C.
        image_size: S.
        max_width: widest feature map (1024 in the paper).
    """

    def __init__(self, in_features: int, out_channels: int, image_size: int, max_width: int = 1024) -> None:
        super().__init__()
        self.image_size = image_size
        #: the constructor arguments, enough to rebuild this network (saved by :class:`~fdattack.lit.InversionLitModule`)
        self.init_kwargs = {"in_features": in_features, "out_channels": out_channels, "image_size": image_size, "max_width": max_width}
        stages = max(1, math.ceil(math.log2(image_size / 4)))
        widths = [min(max_width, 128 * 2 ** (stages - 1 - i)) for i in range(stages)]
        layers: list[nn.Module] = [nn.ConvTranspose2d(in_features, widths[0], 4, 1, 0), nn.BatchNorm2d(widths[0]), nn.Tanh()]
        for i in range(stages):
            last = i == stages - 1
            out = out_channels if last else widths[i + 1]
            layers.append(nn.ConvTranspose2d(widths[i], out, 4, 2, 1))
            layers += [nn.Tanh()] if last else [nn.BatchNorm2d(out), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        self.native_size = 4 * 2**stages

    def forward(self, p: Tensor) -> Tensor:
        x = self.net(p.reshape(p.shape[0], -1, 1, 1))
        if self.native_size != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False, antialias=True)
        return x
