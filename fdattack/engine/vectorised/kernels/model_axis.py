"""The leading model axis of the vectorised path's custom CPU layers (:mod:`fdattack.engine.vectorised.kernels.conv_pool`,
:mod:`fdattack.engine.vectorised.kernels.batched_linear`): their ``autograd.Function`` vmap rules fold vmap's models into it."""

from __future__ import annotations

from torch import Tensor


def fold(t: Tensor, dim: int | None, size: int) -> Tensor:
    """``t`` with its vmapped dimension (``size`` copies where it has none, expanded, not copied) merged into its
    leading model axis."""
    return (t.expand(size, *t.shape) if dim is None else t.movedim(dim, 0)).flatten(0, 1)
