"""A network's first convolution and the max-pool after it, computed a few rows at a time: a CPU layer of the
vectorised path (:mod:`fdattack.engine.vectorised`).

The first convolution of a small image network writes the network's largest activation (``pli_cnn`` on MNIST:
32 x 26 x 26 values per row), and the max-pool after it keeps one value in nine. Run as two vmapped layers, a
call's activation (several models' batches, tens of MB) goes to memory and back four times: the matrix product
writes it, the pool reads it, and in backward autograd scatters the pool's gradient into a zero tensor of the same
size that the kernel's gradient product reads again. :class:`ConvMaxPool` computes the same values in chunks of
a few rows whose activation stays in the CPU's cache from the product to the pool, keeps only the pooled values
and the pool's argmax indices for backward, and recomputes each chunk's im2col columns there. The columns are
transposed, a row per kernel entry, made by one copy of the chunk's unfolded view (2.5x as fast as concatenating
shifted slices on MNIST); the bias is added after the pool (a window's maximum plus the bias is the maximum of
the biased window), to the pooled values only. It also skips the convolution rows and columns a floor-mode pool
never reads (2 of 26 on MNIST).

The gradient reaches the kernel and the bias only, so the module takes this path only where its input needs no
gradient (a layer that takes the data), and only where one model's batch of convolution outputs exceeds a chunk
(MNIST's 64 x 32 x 24 x 24; the 8 x 8 digits' fit in cache anyway); otherwise it runs the convolution and the pool
as two layers. :func:`fuse_conv_pool` puts it into a network. For DP-SGD's per-sample gradients under
``vmap(grad)`` (``per_sample``), every call sees one row: the layer then always takes the chunked path, the vmapped rows
join its rows, and backward computes each row's kernel gradient in chunks of rows (:class:`_RowKernelGrads`).
The values are those of ``F.max_pool2d(F.conv2d(x))`` up to the order of each convolution's sum; ties within a window
go to the first maximum, as PyTorch's pool sends them (adding the bias after the maximum can only differ there when the
bias rounds two different sums to one value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.engine.vectorised.kernels.im2col import conv2d, pair
from fdattack.engine.vectorised.kernels.model_axis import as_rows, fold
from fdattack.engine.vectorised.kernels.rewrite import rewrite_pairs

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
        """The transposed im2col matrix (C·kh·kw, n·h·w) of x (n, C, H, W) for the ``used`` = (h, w) convolution
        outputs: a row per kernel entry in ``weight.flatten(1)`` order, in one copy of x's unfolded view (as fast
        as one image-sized copy, and its rows are long enough for a fast product)."""
        (kh, kw), (sh, sw), (ph, pw), (h, w) = self.kernel, self.stride, self.padding, used
        if ph or pw:
            x = F.pad(x, (pw, pw, ph, ph))
        patches = x.unfold(2, kh, sh).unfold(3, kw, sw)[:, :, :h, :w]  # (n, C, h, w, kh, kw)
        return patches.permute(1, 4, 5, 0, 2, 3).reshape(-1, x.shape[0] * h * w)

    def pool_backward(self, grad: Tensor, indices: Tensor, like: Tensor) -> Tensor:
        """The pool's input gradient (n, O, h, w), channels-last like ``like``, from the channels-last pooled gradient
        and argmax indices (PyTorch's CPU pool backward is several times slower on mixed layouts)."""
        return torch.ops.aten.max_pool2d_with_indices_backward(
            grad, like, list(self.pool), list(self.pool_stride), [0, 0], [1, 1], False, indices
        )


def _chunks(models: int, rows: int, per_row: int) -> Iterator[tuple[int, slice]]:
    """(model, rows) pairs covering every model's rows: near-equal spans of one model's rows of at most
    :data:`CHUNK_ELEMENTS` convolution outputs (``per_row`` each), or single rows."""
    fit = max(1, CHUNK_ELEMENTS // per_row)
    span = -(-rows // -(-rows // fit))  # ceil(rows / number of chunks)
    for model in range(models):
        for start in range(0, rows, span):
            yield model, slice(start, min(start + span, rows))


class _ConvMaxPoolFunction(torch.autograd.Function):
    """``max_pool2d(conv2d(x))`` over a leading model axis: x (M, B, C, H, W), kernel (M, D, O) (see :func:`_kernel`)
    and bias (M, O) give the pooled (M, B, O, h, w) values and their argmax indices.

    Per chunk (:func:`_chunks`): the chunk's im2col columns, one matrix product, the pool, then the bias (a window's
    maximum plus the bias is the maximum of the biased window); backward recomputes the columns.
    """

    @staticmethod
    def forward(x: Tensor, kernel: Tensor, bias: Tensor, geometry: Geometry) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        (m, b), o = x.shape[:2], kernel.shape[2]
        used, (ph, pw) = geometry.sizes(*x.shape[-2:])
        pooled = x.new_empty(m, b, o, ph, pw)  # contiguous, so that a Flatten after the layer is a view
        indices = torch.empty(m, b, ph, pw, o, dtype=torch.long, device=x.device)  # channels-last, as the pool makes them
        for model, rows in _chunks(m, b, used[0] * used[1] * o):
            chunk = x[model, rows]
            out = torch.mm(geometry.columns(chunk, used).t(), kernel[model]).view(-1, *used, o).permute(0, 3, 1, 2)
            values, argmax = F.max_pool2d_with_indices(out, geometry.pool, geometry.pool_stride)
            torch.add(values, bias[model, :, None, None], out=pooled[model, rows])
            indices[model, rows].permute(0, 3, 1, 2).copy_(argmax)
        return pooled, indices.permute(0, 1, 4, 2, 3)

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
        x, kernel, _, geometry = inputs
        ctx.save_for_backward(x, output[1])
        ctx.geometry, ctx.kernel_shape = geometry, kernel.shape  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor, _: Tensor) -> tuple[None, Tensor, Tensor, None]:  # type: ignore[override]
        x, indices = ctx.saved_tensors  # type: ignore[attr-defined]
        geometry: Geometry = ctx.geometry  # type: ignore[attr-defined]
        if x.shape[:2] == (1, 1):  # one row of one model: a per-sample gradient under vmap(grad), see _RowKernelGrads
            return None, _RowKernelGrads.apply(x, indices, grad, geometry).sum(1), grad.sum((1, 3, 4)), None
        (m, b), o = x.shape[:2], grad.shape[2]
        used, _ = geometry.sizes(*x.shape[-2:])
        grad = grad.permute(0, 1, 3, 4, 2).contiguous()  # channels-last, as the indices
        bias_grad = grad.sum((1, 2, 3))
        grad = grad.permute(0, 1, 4, 2, 3)
        kernel_grad = grad.new_zeros(ctx.kernel_shape)  # type: ignore[attr-defined]
        for model, rows in _chunks(m, b, used[0] * used[1] * o):
            chunk = x[model, rows]
            like = grad.new_empty(chunk.shape[0], *used, o).permute(0, 3, 1, 2)  # the pool's input layout (values unused)
            dense = geometry.pool_backward(grad[model, rows], indices[model, rows], like)
            kernel_grad[model].addmm_(geometry.columns(chunk, used), dense.permute(0, 2, 3, 1).reshape(-1, o))
        return None, kernel_grad, bias_grad, None

    @staticmethod
    def vmap(
        info: object, in_dims: tuple, x: Tensor, kernel: Tensor, bias: Tensor, geometry: Geometry
    ) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
        """Under vmap, the vmapped models join the model axis; where only the input is vmapped (per-sample gradients:
        one model's rows), its copies join the rows instead."""
        size = info.batch_size  # type: ignore[attr-defined]
        if in_dims[1] is None and in_dims[2] is None:
            pooled, indices = _ConvMaxPoolFunction.apply(as_rows(x, in_dims[0], size), kernel, bias, geometry)
            return (pooled.unflatten(1, (size, -1)), indices.unflatten(1, (size, -1))), (1, 1)
        x, kernel, bias = (fold(t, dim, size) for t, dim in zip((x, kernel, bias), in_dims[:3]))
        pooled, indices = _ConvMaxPoolFunction.apply(x, kernel, bias, geometry)
        return (pooled.unflatten(0, (size, -1)), indices.unflatten(0, (size, -1))), (0, 0)


class _RowKernelGrads(torch.autograd.Function):
    """Each row's kernel gradient of :class:`_ConvMaxPoolFunction`: x (M, B, C, H, W), the argmax indices and the pooled
    gradient (M, B, O, h, w) give (M, B, D, O), per row the chunk's im2col columns times its dense pool gradient, a
    chunk of rows at a time so that both stay in cache. A row's gradient needs nothing of the other rows nor of the
    kernel, so under vmap every vmapped level joins the rows: DP-SGD's per-sample gradients of all models' rows in one
    chunked pass instead of vmap's batched pool backward over every convolution output. Not differentiable itself."""

    @staticmethod
    def forward(x: Tensor, indices: Tensor, grad: Tensor, geometry: Geometry) -> Tensor:  # type: ignore[override]
        (m, b), o = x.shape[:2], grad.shape[2]
        used, _ = geometry.sizes(*x.shape[-2:])
        grad = grad.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)  # channels-last, as the indices
        out = grad.new_empty(m, b, x.shape[2] * geometry.kernel[0] * geometry.kernel[1], o)
        for model, rows in _chunks(m, b, used[0] * used[1] * o):
            chunk = x[model, rows]
            n = chunk.shape[0]
            like = grad.new_empty(n, *used, o).permute(0, 3, 1, 2)  # the pool's input layout (values unused)
            dense = geometry.pool_backward(grad[model, rows], indices[model, rows], like).permute(0, 2, 3, 1).reshape(n, -1, o)
            torch.bmm(geometry.columns(chunk, used).view(-1, n, dense.shape[1]).transpose(0, 1), dense, out=out[model, rows])
        return out

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> None:  # type: ignore[override]
        raise RuntimeError("per-row kernel gradients are not differentiated again")

    @staticmethod
    def vmap(info: object, in_dims: tuple, x: Tensor, indices: Tensor, grad: Tensor, geometry: Geometry) -> tuple[Tensor, int]:
        """Under vmap, the vmapped copies join the rows."""
        size = info.batch_size  # type: ignore[attr-defined]
        rows = (as_rows(t, dim, size) for t, dim in zip((x, indices, grad), in_dims[:3]))
        return _RowKernelGrads.apply(*rows, geometry).unflatten(1, (size, -1)), 1


def _kernel(weight: Tensor) -> Tensor:
    """The (C·kh·kw, O) matrix that multiplies :meth:`Geometry.columns`' transpose (a view of ``weight``)."""
    return weight.flatten(1).t()


class ConvMaxPool(nn.Module):
    """``pool(conv(x))`` for a ``conv`` and ``pool`` that :func:`fusable` accepts, with the conv's ``weight`` and
    ``bias`` as its own (so a network's parameter names stay as they were)."""

    def __init__(self, conv: nn.Conv2d, pool: nn.MaxPool2d, per_sample: bool = False) -> None:
        super().__init__()
        self.weight = conv.weight
        self.bias = conv.bias
        self.per_sample = per_sample
        self.geometry = Geometry(
            pair(conv.kernel_size),
            pair(conv.stride),
            pair(conv.padding),  # type: ignore[arg-type]
            pair(pool.kernel_size),
            pair(pool.stride or pool.kernel_size),
        )

    def _conv_outputs(self, x: Tensor) -> int:
        """Convolution outputs per row of ``x`` (N, C, H, W) that the pool reads."""
        (h, w), _ = self.geometry.sizes(*x.shape[-2:])
        return h * w * self.weight.shape[0]

    def _chunked(self, x: Tensor) -> bool:
        """Whether ``x`` takes the chunked path: it needs no gradient, the pool has an output, and one model's
        convolution outputs exceed a chunk (smaller ones already stay in cache as two layers) or the layer computes
        per-sample gradients (one row a call, the rows of all calls chunked together)."""
        _, (h, w) = self.geometry.sizes(*x.shape[-2:])
        large = self.per_sample or x.shape[0] * self._conv_outputs(x) > CHUNK_ELEMENTS
        return not x.requires_grad and x.dim() == 4 and min(h, w) >= 1 and large

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
        bias = self.bias if self.bias is not None else self.weight.new_zeros(self.weight.shape[0])
        pooled, _ = _ConvMaxPoolFunction.apply(x[None], _kernel(self.weight)[None], bias[None], self.geometry)
        return pooled.squeeze(0)  # not pooled[0]: select's backward would write a zero tensor of the whole output


def fusable(conv: nn.Module, pool: nn.Module) -> bool:
    """Whether :class:`ConvMaxPool` computes ``pool(conv(x))``: a plain zero-padded convolution and a floor-mode pool
    without padding, dilation or indices."""
    return (
        type(conv) is nn.Conv2d
        and conv.groups == 1
        and pair(conv.dilation) == (1, 1)
        and not isinstance(conv.padding, str)
        and conv.padding_mode == "zeros"
        and type(pool) is nn.MaxPool2d
        and pair(pool.padding) == (0, 0)
        and pair(pool.dilation) == (1, 1)
        and not pool.ceil_mode
        and not pool.return_indices
    )


def fuse_conv_pool(net: nn.Module, per_sample: bool = False) -> nn.Module:
    """``net``, or a copy in which every ``Conv2d`` directly followed by a ``MaxPool2d`` in an ``nn.Sequential`` (see
    :func:`fusable`) is one :class:`ConvMaxPool` (and the pool an ``Identity``); parameter names are unchanged.
    ``per_sample``: the copy computes per-sample gradients under ``vmap(grad)`` (DP-SGD), each call on one row."""
    return rewrite_pairs(net, fusable, lambda conv, pool: (ConvMaxPool(conv, pool, per_sample), nn.Identity()))  # type: ignore[arg-type]
