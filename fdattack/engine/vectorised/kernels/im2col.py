"""2-D convolutions as im2col + one matrix product with a channels-last result: the CPU convolution of the
vectorised path (:mod:`fdattack.engine.vectorised`).

Under vmap, per-model weights make ``F.conv2d`` one grouped convolution with an NCHW result, on which PyTorch's
CPU pooling kernels are several times slower; the matrix product of shifted-slice columns is also faster than the
grouped convolution for the small networks of FD clients. The bias rides in the product as a column of ones (a
vmapped ``addmm`` adds it in a second pass over the output).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def pair(value: int | Sequence[int]) -> tuple[int, int]:
    """``(v, v)`` for an int, the first two entries otherwise."""
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def columns(x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int], out_size: tuple[int, int]) -> Tensor:
    """The im2col matrix (n·h·w, kh·kw·C + 1) of x (n, C, H, W) for the first ``out_size`` = (h, w) output positions
    of a convolution: per output position its input patch in (i, j, c) order, then a 1 for the bias."""
    (kh, kw), (sh, sw), (ph, pw), (h, w) = kernel, stride, padding, out_size
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    pixels = x.permute(0, 2, 3, 1)  # (n, H, W, C)
    shifted = [pixels[:, i : i + sh * (h - 1) + 1 : sh, j : j + sw * (w - 1) + 1 : sw] for i in range(kh) for j in range(kw)]
    ones = pixels.new_ones(1, 1, 1, 1).expand(*shifted[0].shape[:3], 1)
    return torch.cat([*shifted, ones], dim=-1).view(-1, kh * kw * x.shape[1] + 1)


def kernel_matrix(weight: Tensor, bias: Tensor | None) -> Tensor:
    """The (kh·kw·C + 1, O) matrix that multiplies :func:`columns`: the weight in (i, j, c) order, then the bias."""
    rows = weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1)
    last = bias[:, None] if bias is not None else rows.new_zeros(weight.shape[0], 1)
    return torch.cat([rows, last], dim=1).t().contiguous()  # row-major: a transposed right factor slows its gradient


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> Tensor:
    """``F.conv2d`` as :func:`columns` times :func:`kernel_matrix`, its result channels-last in memory (``F.conv2d``
    itself for grouped, dilated or ``padding="same"`` convolutions). Same sums, in another order."""
    if input.dim() != 4 or groups != 1 or isinstance(padding, str) or pair(dilation) != (1, 1):
        return F.conv2d(input, weight, bias, stride, padding, dilation, groups)
    (sh, sw), (ph, pw) = pair(stride), pair(padding)
    kh, kw = weight.shape[-2:]
    n, _, h, w = input.shape
    out_size = ((h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1)
    out = columns(input, (kh, kw), (sh, sw), (ph, pw), out_size) @ kernel_matrix(weight, bias)
    return out.view(n, *out_size, weight.shape[0]).permute(0, 3, 1, 2)
