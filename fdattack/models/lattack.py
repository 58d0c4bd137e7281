"""The L-Attack's generator network (Xiao et al., DSN 2024, §VI-A, which does not give its architecture): DCGAN-style,
upsampling from a quarter-size map."""

from __future__ import annotations

from torch import Tensor, nn


def _up_block(c_in: int, c_out: int) -> nn.Sequential:
    """Upsample ×2 (nearest) + Conv3×3 (no bias: BN follows) + BN + ReLU: doubles the sides."""
    return nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


class UpsamplingGenerator(nn.Module):
    """z (B, z_dim) → images (B, C, H, W) in [0, 1], for any H and W that are multiples of 4.

    Linear(z_dim → w·(H/4)·(W/4)) + BN1d + ReLU (no biases before BN), reshaped to a (w, H/4, W/4) map; Upsample×2 + Conv3×3(w → w) + BN +
    ReLU;
    Upsample×2 + Conv3×3(w → w/2) + BN + ReLU; Conv3×3(w/2 → C) + Sigmoid. The paper gives no architecture; this is a DCGAN-style
    choice.

    Args:
        image_shape: (C, H, W), H and W multiples of 4.
        z_dim: noise size (100 in the paper).
        width: w, the channels of the first map (128 by default; smaller for CPU runs).
    """

    def __init__(self, image_shape: tuple[int, int, int], z_dim: int = 100, width: int = 128) -> None:
        super().__init__()
        c, h, w = image_shape
        if h % 4 or w % 4 or h < 4 or w < 4:
            raise ValueError(f"the generator needs image sides that are multiples of 4; got {h}x{w}")
        self.z_dim = z_dim
        self.start = (width, h // 4, w // 4)
        half = max(1, width // 2)
        self.project = nn.Sequential(
            nn.Linear(z_dim, width * (h // 4) * (w // 4), bias=False), nn.BatchNorm1d(width * (h // 4) * (w // 4)), nn.ReLU()
        )
        self.decode = nn.Sequential(_up_block(width, width), _up_block(width, half), nn.Conv2d(half, c, 3, padding=1), nn.Sigmoid())

    def forward(self, z: Tensor) -> Tensor:
        return self.decode(self.project(z).view(z.shape[0], *self.start))
