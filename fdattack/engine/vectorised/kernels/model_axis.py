"""The leading model axis of the vectorised path's custom CPU layers (:mod:`fdattack.engine.vectorised.kernels.conv_pool`,
:mod:`fdattack.engine.vectorised.kernels.batched_linear`): their ``autograd.Function`` vmap rules fold vmap's models into it,
or a model's vmapped rows into its rows."""

from __future__ import annotations

from torch import Tensor


def fold(t: Tensor, dim: int | None, size: int) -> Tensor:
    """``t`` with its vmapped dimension (``size`` copies where it has none, expanded, not copied) merged into its
    leading model axis."""
    return (t.expand(size, *t.shape) if dim is None else t.movedim(dim, 0)).flatten(0, 1)


def as_rows(t: Tensor, dim: int | None, size: int) -> Tensor:
    """``t`` (M, B, ...) with its vmapped dimension (``size`` copies where it has none, expanded) merged into its rows:
    (M, size·B, ...). For a level that vmaps a model's rows (per-sample gradients), not the models."""
    moved = t.unsqueeze(1).expand(t.shape[0], size, *t.shape[1:]) if dim is None else t.movedim(dim, 1)
    return moved.flatten(1, 2)
