"""``F.linear`` with per-model weights as batched products in their fast orientations: a CPU layer of the vectorised
path (:mod:`fdattack.engine.vectorised`).

Under vmap, PyTorch computes a batched linear layer's weight gradient as ``bmm(xᵀ, g)`` with a transposed left
factor and a 10-column result (``pli_cnn`` on MNIST: (2048, 64) @ (64, 10) per model), about 7x as slow on one
CPU thread as the same numbers computed as ``bmm(gᵀ, x)``; its forward is also faster as ``(W @ xᵀ)ᵀ``.
:func:`linear` computes the layer, under vmap or not, with these orientations: the same sums, in another order.
Its input gradient ``g W`` in backward is a function of its own with the same vmap rule, so that under DP-SGD's
per-sample ``vmap(grad)`` a model's rows share its weight (PyTorch's batched ``bmm`` copies it once per row).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fdattack.engine.vectorised.kernels.model_axis import as_rows, fold


class _LinearFunction(torch.autograd.Function):
    """``x Wᵀ + b`` over a leading model axis: x (M, B, I), weight (M, O, I) and bias (M, O) or None give (M, B, O)."""

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        transposed = torch.bmm(weight, x.transpose(1, 2)) if bias is None else torch.baddbmm(bias[:, :, None], weight, x.transpose(1, 2))
        return transposed.transpose(1, 2).contiguous()

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor) -> None:
        x, weight, _ = inputs
        ctx.save_for_backward(x, weight)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # type: ignore[override]
        x, weight = ctx.saved_tensors  # type: ignore[attr-defined]
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad  # type: ignore[attr-defined]
        return (
            _InputGradFunction.apply(grad, weight) if needs_x else None,
            _weight_grad(grad, x) if needs_weight else None,
            grad.sum(1) if needs_bias else None,
        )

    @staticmethod
    def vmap(info: object, in_dims: tuple, x: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, int]:
        return _on_model_axis(_LinearFunction, info, in_dims, x, weight, bias)


class _InputGradFunction(torch.autograd.Function):
    """The input gradient ``g W`` of :class:`_LinearFunction` over a leading model axis: g (M, B, O) and weight (M, O, I)
    give (M, B, I). Its own function so that under vmap a model's rows share its weight: in the backward of DP-SGD's
    per-sample gradients (``vmap(grad)`` over rows), PyTorch's batched ``bmm`` would copy the weight once per row
    (``pli_cnn`` on MNIST: 20,480 numbers a row)."""

    @staticmethod
    def forward(grad: Tensor, weight: Tensor) -> Tensor:  # type: ignore[override]
        return torch.bmm(grad, weight)

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, upstream: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        grad, weight = ctx.saved_tensors  # type: ignore[attr-defined]
        return torch.bmm(upstream, weight.transpose(1, 2)), torch.bmm(grad.transpose(1, 2), upstream)

    @staticmethod
    def vmap(info: object, in_dims: tuple, grad: Tensor, weight: Tensor) -> tuple[Tensor, int]:
        return _on_model_axis(_InputGradFunction, info, in_dims, grad, weight)


def _on_model_axis(
    function: type[torch.autograd.Function], info: object, in_dims: tuple, x: Tensor, *others: Tensor | None
) -> tuple[Tensor, int]:
    """The vmap rule of a batched product ``function(x, *others)``: the vmapped models join the model axis; where only
    ``x`` is vmapped (per-sample gradients: one model, many rows), its copies join the rows instead, so that the
    weight is not copied."""
    size = info.batch_size  # type: ignore[attr-defined]
    if all(dim is None for dim in in_dims[1:]):
        return function.apply(as_rows(x, in_dims[0], size), *others).unflatten(1, (size, -1)), 1
    folded = [None if t is None else fold(t, dim, size) for t, dim in zip((x, *others), in_dims)]
    return function.apply(*folded).unflatten(0, (size, -1)), 0


def _weight_grad(grad: Tensor, x: Tensor) -> Tensor:
    """gᵀ x per model, (M, O, I); for one row (a per-sample gradient) the outer product, by broadcasting (``bmm`` over an
    inner dimension of one takes 1.4x as long on MNIST's 10 x 2048 under vmap)."""
    return grad.transpose(1, 2) * x if x.shape[1] == 1 else torch.bmm(grad.transpose(1, 2), x)


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(input, weight, bias)`` for an input of any number of leading dimensions (see the module docstring)."""
    lead = input.shape[:-1]
    flat = input.reshape(1, -1, input.shape[-1])
    out = _LinearFunction.apply(flat, weight[None], None if bias is None else bias[None])
    return out.view(*lead, weight.shape[0])
