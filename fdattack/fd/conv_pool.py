"""A network's first convolution and the max-pool after it, computed a few rows at a time: a CPU layer of the
vectorised path (:mod:`fdattack.fd.vectorised`).

The first convolution of a small image network writes the network's largest activation (``pli_cnn`` on MNIST:
32 x 26 x 26 values per row), and the max-pool after it keeps one value in nine. Run as two vmapped layers, a
call's activation (several models' batches, tens of MB) goes to memory and back four times: the matrix product
writes it, the pool reads it, and in backward autograd scatters the pool's gradient into a zero tensor of the same
size that the kernel's gradient product reads again. :class:`ConvMaxPool` computes the same values in chunks of
a few rows whose activation stays in the CPU's cache from the product to the pool, keeps only the pooled values
and the pool's argmax indices for backward, and recomputes each chunk's im2col columns there. It also skips the
convolution rows and columns a floor-mode pool never reads (2 of 26 on MNIST).

The gradient reaches the kernel and the bias only, so the module takes this path only where its input needs no
gradient (a layer that takes the data), and only where one model's batch of convolution outputs exceeds a chunk
(MNIST's 64 x 32 x 24 x 24; the 8 x 8 digits' fit in cache anyway); otherwise it runs the convolution and the pool
as two layers. On MNIST's shadow students (``benchmarks/bench_students.py``) it makes the vectorised path 1.25x as
fast.
:func:`fuse_conv_pool` puts it into a network. Same sums as :func:`fdattack.fd.im2col.conv2d` then ``max_pool2d``,
chunk by chunk, and the same argmax (the first maximum of each window), so the same gradients up to the order in
which the chunks' kernel gradients are added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.fd.im2col import columns, conv2d, kernel_matrix, pair
from fdattack.fd.rewrite import rewrite_pairs

#: the most convolution outputs one chunk computes before pooling them (2 MB of float32; 2**18 to 2**21 train
#: MNIST's shadow students equally fast)
CHUNK_ELEMENTS = 1 << 19


@dataclass(frozen=True)
class Geometry:
    """A ``Conv2d`` (groups 1, dilation 1, zero padding) followed by a floor-mode ``MaxPool2d`` (no padding or dilation)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    pool: tuple[int, int]
    pool_stride: tuple[int, int]

    def sizes(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """((rows, columns) of the convolution output the pool reads, (rows, columns) of the pool's output)."""
        used, pooled = [], []
        for size, k, s, p, pk, ps in zip((height, width), self.kernel, self.stride, self.padding, self.pool, self.pool_stride):
            n = ((size + 2 * p - k) // s + 1 - pk) // ps + 1
            used.append((n - 1) * ps + pk)
            pooled.append(n)
        return (used[0], used[1]), (pooled[0], pooled[1])

    def columns(self, x: Tensor, used: tuple[int, int]) -> Tensor:
        """(M, n·h·w, D + 1) im2col columns of x (M, n, C, H, W) for the ``used`` = (h, w) convolution outputs."""
        cols = columns(x.flatten(0, 1), self.kernel, self.stride, self.padding, used)
        return cols.view(x.shape[0], -1, cols.shape[-1])

    def pool_backward(self, grad: Tensor, indices: Tensor, like: Tensor) -> Tensor:
        """The pool's input gradient (n, O, h, w), channels-last like ``like``, from the pooled gradient and argmax indices."""
        return torch.ops.aten.max_pool2d_with_indices_backward(
            _channels_last(grad), like, list(self.pool), list(self.pool_stride), [0, 0], [1, 1], False, _channels_last(indices))


def _chunks(models: int, rows: int, per_row: int) -> Iterator[tuple[slice, slice]]:
    """(models, rows) slices covering every model's rows: near-equal spans of one model's rows of at most
    :data:`CHUNK_ELEMENTS` convolution outputs (``per_row`` each), or single rows."""
    fit = max(1, CHUNK_ELEMENTS // per_row)
    span = -(-rows // -(-rows // fit))  # ceil(rows / number of chunks)
    for model in range(models):
        for start in range(0, rows, span):
            yield slice(model, model + 1), slice(start, min(start + span, rows))


class _ConvMaxPoolFunction(torch.autograd.Function):
    """``max_pool2d(conv2d(x))`` over a leading model axis: x (M, B, C, H, W) and kernel (M, D + 1, O) (see
    :func:`~fdattack.fd.im2col.kernel_matrix`) give the pooled (M, B, O, h, w) values and their argmax indices.

    Per chunk (:func:`_chunks`): the chunk's im2col columns, one matrix product, the pool; backward recomputes the
    columns.
    """

    @staticmethod
    def forward(x: Tensor, kernel: Tensor, geometry: Geometry) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        (m, b), o = x.shape[:2], kernel.shape[2]
        used, (ph, pw) = geometry.sizes(*x.shape[-2:])
        pooled = x.new_empty(m, b, ph, pw, o)  # channels-last, as the pool makes it
        indices = torch.empty(m, b, ph, pw, o, dtype=torch.long, device=x.device)
        for models, rows in _chunks(m, b, used[0] * used[1] * o):
            chunk = x[models, rows]
            out = torch.bmm(geometry.columns(chunk, used), kernel[models]).view(-1, *used, o).permute(0, 3, 1, 2)
            values, argmax = F.max_pool2d_with_indices(out, geometry.pool, geometry.pool_stride)
            pooled[models, rows] = values.permute(0, 2, 3, 1).unflatten(0, chunk.shape[:2])
            indices[models, rows] = argmax.permute(0, 2, 3, 1).unflatten(0, chunk.shape[:2])
        return pooled.permute(0, 1, 4, 2, 3), indices.permute(0, 1, 4, 2, 3)

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
        x, kernel, geometry = inputs
        ctx.save_for_backward(x, output[1])
        ctx.geometry, ctx.kernel_shape = geometry, kernel.shape  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor, _: Tensor) -> tuple[None, Tensor, None]:  # type: ignore[override]
        x, indices = ctx.saved_tensors  # type: ignore[attr-defined]
        geometry: Geometry = ctx.geometry  # type: ignore[attr-defined]
        (m, b), o = x.shape[:2], grad.shape[2]
        used, _ = geometry.sizes(*x.shape[-2:])
        grad = grad.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)  # channels-last, as the indices
        kernel_grad = grad.new_zeros(ctx.kernel_shape)  # type: ignore[attr-defined]
        for models, rows in _chunks(m, b, used[0] * used[1] * o):
            chunk = x[models, rows]
            images = chunk.shape[0] * chunk.shape[1]
            like = grad.new_empty(images, *used, o).permute(0, 3, 1, 2)  # the pool's input layout (values unused)
            dense = geometry.pool_backward(grad[models, rows].flatten(0, 1), indices[models, rows].flatten(0, 1), like)
            cols = geometry.columns(chunk, used)
            kernel_grad[models].baddbmm_(cols.transpose(1, 2), dense.permute(0, 2, 3, 1).reshape(chunk.shape[0], -1, o))
        return None, kernel_grad, None

    @staticmethod
    def vmap(info: object, in_dims: tuple, x: Tensor, kernel: Tensor, geometry: Geometry) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
        """Under vmap, the vmapped models join the model axis."""
        size = info.batch_size  # type: ignore[attr-defined]
        x, kernel = (_fold(t, dim, size) for t, dim in zip((x, kernel), in_dims[:2]))
        pooled, indices = _ConvMaxPoolFunction.apply(x, kernel, geometry)
        return (pooled.unflatten(0, (size, -1)), indices.unflatten(0, (size, -1))), (0, 0)


def _fold(t: Tensor, dim: int | None, size: int) -> Tensor:
    """``t`` with its vmapped dimension (``size`` copies where it has none) merged into its leading model axis."""
    return (t.expand(size, *t.shape) if dim is None else t.movedim(dim, 0)).flatten(0, 1)


def _channels_last(t: Tensor) -> Tensor:
    """A 4-D tensor in channels-last memory: PyTorch's CPU pool backward is several times slower on mixed layouts."""
    return t.contiguous(memory_format=torch.channels_last)


class ConvMaxPool(nn.Module):
    """``pool(conv(x))`` for a ``conv`` and ``pool`` that :func:`fusable` accepts, with the conv's ``weight`` and
    ``bias`` as its own (so a network's parameter names stay as they were)."""

    def __init__(self, conv: nn.Conv2d, pool: nn.MaxPool2d) -> None:
        super().__init__()
        self.weight = conv.weight
        self.bias = conv.bias
        self.geometry = Geometry(pair(conv.kernel_size), pair(conv.stride), pair(conv.padding),  # type: ignore[arg-type]
                                 pair(pool.kernel_size), pair(pool.stride or pool.kernel_size))

    def _conv_outputs(self, x: Tensor) -> int:
        """Convolution outputs per row of ``x`` (N, C, H, W) that the pool reads."""
        (h, w), _ = self.geometry.sizes(*x.shape[-2:])
        return h * w * self.weight.shape[0]

    def _chunked(self, x: Tensor) -> bool:
        """Whether ``x`` takes the chunked path: it needs no gradient, the pool has an output, and one model's
        convolution outputs exceed a chunk (smaller ones already stay in cache as two layers)."""
        _, (h, w) = self.geometry.sizes(*x.shape[-2:])
        return not x.requires_grad and x.dim() == 4 and min(h, w) >= 1 and x.shape[0] * self._conv_outputs(x) > CHUNK_ELEMENTS

    def elements_held(self, x: Tensor) -> int:
        """The float32 elements the module holds at its peak for ``x`` beyond a chunk: the pooled values and their int64
        argmax indices (3 per pooled value) on the chunked path, the convolution's output otherwise."""
        if not self._chunked(x):
            return x.shape[0] * self._conv_outputs(x)
        _, (h, w) = self.geometry.sizes(*x.shape[-2:])
        return 3 * x.shape[0] * h * w * self.weight.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        if not self._chunked(x):
            g = self.geometry
            return F.max_pool2d(conv2d(x, self.weight, self.bias, g.stride, g.padding), g.pool, g.pool_stride)
        pooled, _ = _ConvMaxPoolFunction.apply(x[None], kernel_matrix(self.weight, self.bias)[None], self.geometry)
        return pooled[0]


def fusable(conv: nn.Module, pool: nn.Module) -> bool:
    """Whether :class:`ConvMaxPool` computes ``pool(conv(x))``: a plain zero-padded convolution and a floor-mode pool
    without padding, dilation or indices."""
    return (type(conv) is nn.Conv2d and conv.groups == 1 and pair(conv.dilation) == (1, 1) and not isinstance(conv.padding, str)
            and conv.padding_mode == "zeros" and type(pool) is nn.MaxPool2d and pair(pool.padding) == (0, 0)
            and pair(pool.dilation) == (1, 1) and not pool.ceil_mode and not pool.return_indices)


def fuse_conv_pool(net: nn.Module) -> nn.Module:
    """``net``, or a copy in which every ``Conv2d`` directly followed by a ``MaxPool2d`` in an ``nn.Sequential`` (see
    :func:`fusable`) is one :class:`ConvMaxPool` (and the pool an ``Identity``); parameter names are unchanged."""
    return rewrite_pairs(net, fusable, lambda conv, pool: (ConvMaxPool(conv, pool), nn.Identity()))  # type: ignore[arg-type]
