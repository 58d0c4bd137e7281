"""Auxiliary-domain transforms: how the insensitive public look of an image is made (Takahashi et al., CVPR 2023, §4.1)."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor

from fdattack.registry import Registry

DomainTransform = Callable[[Tensor, int], Tensor]
DOMAIN_TRANSFORMS: Registry[DomainTransform] = Registry("domain transform", "data.aux_domain")


@DOMAIN_TRANSFORMS.register("blur")
def box_blur(images: Tensor, k: int) -> Tensor:
    """Normalized k x k box blur with reflected borders, like ``cv2.blur`` (Takahashi et al., CVPR 2023, §4.1,
    FaceScrub; the authors' code).

    Args:
        images: (N, C, H, W) float images.
        k: kernel side in pixels (>= 1; 1 returns the images unchanged).

    Returns:
        (N, C, H, W) blurred images.
    """
    if k <= 1:
        return images.clone()
    left, right = (k - 1) // 2, k // 2  # OpenCV's anchor for even kernels
    mode = "reflect" if min(images.shape[-2:]) > max(left, right) else "replicate"  # reflect needs pad < size
    padded = F.pad(images, (left, right, left, right), mode=mode)
    return F.avg_pool2d(padded, kernel_size=k, stride=1)


def register_domain_transform(name: str, transform: DomainTransform) -> None:
    """Add a user transform ``(images (N,C,H,W), strength) -> images`` selectable as ``data.aux_domain=name``."""
    DOMAIN_TRANSFORMS.register(name)(transform)


__all__ = ["DOMAIN_TRANSFORMS", "box_blur", "register_domain_transform"]
