"""Ghost clipping of linear layers: DP-SGD's per-sample norms and clipped sums without per-sample weight gradients.

A linear layer y = W a + b that sees one input vector a_i per row (no sequence axis) has the per-sample gradients
∇W_i = δ_i a_iᵀ and ∇b_i = δ_i, where δ_i = ∂ℓ_i/∂y_i is the gradient of row i's loss with respect to the layer's
output. Their squared norms need no (O x I) matrix per row: ‖∇W_i‖² + ‖∇b_i‖² = ‖δ_i‖² (‖a_i‖² + 1) (Goodfellow 2015;
Li et al. 2022, "ghost clipping"); and the clipped sum is one product, Σ_i c_i ∇W_i = (c ⊙ δ)ᵀ A. opacus materialises
∇W_i for every row (``pli_cnn`` on MNIST: 20,490 numbers a row for its one linear layer); this path never does.

:class:`GhostLinears` swaps every such layer of a network for a :class:`GhostLinear`, which adds a zero ``probe``
to its output and keeps its input: differentiating the one-row loss with respect to the probe gives δ_i, and the kept
input is a_i. The other parameters' per-sample gradients are formed as before (:mod:`fdattack.engine.vectorised.private`).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from fdattack.lit.modes import eval_mode


class GhostLinear(nn.Module):
    """A linear layer that adds its ``probe`` buffer (zeros, shape (O,)) to its output and keeps each input it sees in
    :attr:`inputs` (for one-row calls under ``vmap(grad)``: the gradient with respect to the probe is δ_i, the kept
    input a_i). The parameters are the original layer's, under the same names."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.register_buffer("probe", torch.zeros(linear.out_features), persistent=False)
        self.inputs: list[Tensor] = []

    def forward(self, x: Tensor) -> Tensor:
        """``x Wᵀ + b + probe`` as a plain product, not ``F.linear``: the vectorised path's CPU layers take ``F.linear`` to a
        custom function (:mod:`~fdattack.engine.vectorised.kernels.batched_linear`) whose fast weight gradient is not
        needed here, and under ``vmap(grad)`` a custom function costs milliseconds of Python a call."""
        self.inputs.append(x)
        out = x @ self.weight.t()
        return (out if self.bias is None else out + self.bias) + self.probe


def _vector_linears(net: nn.Module, row: Tensor) -> list[str]:
    """Names of the ``nn.Linear`` layers that one eval-mode pass of ``net`` on ``row`` (one row) calls exactly once, on a
    2-D input (one vector a row): those whose per-sample gradient is one outer product."""
    calls: dict[str, list[int]] = {}
    hooks = [
        module.register_forward_hook(lambda m, inputs, out, name=name: calls.setdefault(name, []).append(inputs[0].dim()))
        for name, module in net.named_modules()
        if type(module) is nn.Linear
    ]
    try:
        with torch.no_grad(), eval_mode(net):
            net(row)
    finally:
        for hook in hooks:
            hook.remove()
    return [name for name, dims in calls.items() if dims == [2]]


class GhostLinears:
    """The ghost-clipped linear layers of a network: ``template`` is a copy of the network in which every linear layer
    that :func:`_vector_linears` finds is a :class:`GhostLinear` (the network itself where there is none).

    Under ``vmap(grad)`` over rows, pass :meth:`probes` with the other buffers and differentiate with respect to them;
    :meth:`inputs` (within the same call) returns what the layers kept. :meth:`squared_norms` and :meth:`clipped_sums`
    take the probes' gradients (the δ) and the kept inputs.
    """

    def __init__(self, net: nn.Module, row: Tensor) -> None:
        names = _vector_linears(net, row)
        self.template = copy.deepcopy(net) if names else net
        self.layers: dict[str, GhostLinear] = {}
        for name in names:
            parent, _, attribute = name.rpartition(".")
            owner = self.template.get_submodule(parent)
            self.layers[name] = GhostLinear(getattr(owner, attribute))
            setattr(owner, attribute, self.layers[name])

    @property
    def parameters(self) -> set[str]:
        """The names of the ghost-clipped parameters (each layer's ``weight`` and ``bias``)."""
        return {f"{name}.{kind}" for name, layer in self.layers.items() for kind in ("weight", "bias") if getattr(layer, kind) is not None}

    def probes(self, rows: tuple[int, ...]) -> dict[str, Tensor]:
        """Zero probes for ``rows`` (e.g. (models, rows)), keyed by buffer name, in the layers' dtype and device."""
        return {f"{name}.probe": layer.weight.new_zeros(*rows, layer.weight.shape[0]) for name, layer in self.layers.items()}

    def clear(self) -> None:
        """Forget the inputs the layers kept (before a call)."""
        for layer in self.layers.values():
            layer.inputs.clear()

    def inputs(self) -> dict[str, Tensor]:
        """Each layer's input a_i of the call (one row: its vector), keyed by layer name."""
        return {name: layer.inputs[0][0] for name, layer in self.layers.items()}

    def squared_norms(self, deltas: dict[str, Tensor], inputs: dict[str, Tensor]) -> Tensor | int:
        """Σ over the layers of ‖∇W_i‖² + ‖∇b_i‖² = ‖δ_i‖² (‖a_i‖² + 1) (without the 1 where a layer has no bias), per row:
        the probes' gradients δ (M, S, O) and the inputs a (M, S, I) give (M, S); 0 without layers."""
        total: Tensor | int = 0
        for name, layer in self.layers.items():
            delta, a = deltas[f"{name}.probe"], inputs[name]
            total = total + delta.square().sum(-1) * (a.square().sum(-1) + (0.0 if layer.bias is None else 1.0))
        return total

    def clipped_sums(self, factors: Tensor, deltas: dict[str, Tensor], inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """Σ_i c_i ∇W_i = (c ⊙ δ)ᵀ A (M, O, I) and Σ_i c_i ∇b_i (M, O) per model, keyed by parameter name: ``factors``
        (M, S) are the c_i."""
        sums = {}
        for name, layer in self.layers.items():
            weighted = deltas[f"{name}.probe"] * factors[..., None]
            sums[f"{name}.weight"] = torch.bmm(weighted.transpose(1, 2), inputs[name])
            if layer.bias is not None:
                sums[f"{name}.bias"] = weighted.sum(1)
        return sums
