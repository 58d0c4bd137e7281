"""Adam and SGD over stacked per-model state: one update for every model of a vectorised batch, as ``torch.optim``
does it for each (:func:`stacked_optimizer`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import torch
from torch import Tensor


class _StackedOptimizer(ABC):
    """Per-model optimizer state stacked like the weights of :class:`~fdattack.engine.vectorised.copies._Stack`;
    ``update`` steps the rows of some models, as torch.optim would.

    Reads each model's hyper-parameters and state from its ``torch.optim`` optimizer and writes the state back
    in ``torch.optim``'s own format, so ``state_dict()`` and a later per-model step are unchanged.
    """

    state_keys: tuple[str, ...] = ()

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], names: Sequence[str], params: dict[str, Tensor]) -> None:
        self.optimizers = list(optimizers)
        self.names = list(names)
        self.group = {key: value for key, value in optimizers[0].param_groups[0].items() if key != "params"}
        states = [[opt.state.get(p, {}) for p in opt.param_groups[0]["params"]] for opt in optimizers]
        self.state = {
            key: {
                name: torch.stack([self._initial(s[i], key, params[name][k]) for k, s in enumerate(states)])
                for i, name in enumerate(self.names)
            }
            for key in self.state_keys
        }
        self.started = {
            name: torch.tensor([self._started(s[i]) for s in states], device=params[name].device) for i, name in enumerate(self.names)
        }

    @staticmethod
    def _initial(state: dict, key: str, param: Tensor) -> Tensor:
        value = state.get(key)
        return torch.zeros_like(param) if value is None else value.to(param)

    @abstractmethod
    def _started(self, state: dict) -> float:
        """The step count a model's torch.optim state stands at (0 before its first step)."""

    def update(self, models: Tensor | None, params: dict[str, Tensor], grads: dict[str, Tensor]) -> None:
        """Step ``params`` in place with ``grads``: every model's rows (``models=None``), or the rows of ``models``
        (ascending; ``grads`` rows aligned with them), leaving the other models and their state untouched."""
        for name in self.names:
            if models is None:
                self.started[name] = self._step(
                    params[name], grads[name], {key: self.state[key][name] for key in self.state_keys}, self.started[name]
                )
                continue
            param, state = params[name][models], {key: self.state[key][name][models] for key in self.state_keys}
            self.started[name][models] = self._step(param, grads[name], state, self.started[name][models])
            params[name][models] = param
            for key, value in state.items():
                self.state[key][name][models] = value

    @abstractmethod
    def _step(self, param: Tensor, grad: Tensor, state: dict[str, Tensor], started: Tensor) -> Tensor:
        """One update of the stacked ``param`` rows in place (``state`` too); returns the new per-model step counts."""

    def write_back(self) -> None:
        """Store every model's state in its ``torch.optim`` optimizer."""
        for k, optimizer in enumerate(self.optimizers):
            for i, p in enumerate(optimizer.param_groups[0]["params"]):
                name = self.names[i]
                optimizer.state[p] = self._state_of(k, name)

    @abstractmethod
    def _state_of(self, k: int, name: str) -> dict:
        """Model ``k``'s state of parameter ``name`` in torch.optim's format."""


def _per_model(values: Tensor, like: Tensor) -> Tensor:
    """(G,) per-model values shaped to broadcast against (G, ...) stacked tensors, in their dtype."""
    return values.to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))


class StackedAdam(_StackedOptimizer):
    """``torch.optim.Adam`` (L2 weight decay added to the gradient, bias corrections per model step count)."""

    state_keys = ("exp_avg", "exp_avg_sq")

    def _started(self, state: dict) -> float:
        return float(state["step"]) if "step" in state else 0.0

    def _step(self, param: Tensor, grad: Tensor, state: dict[str, Tensor], started: Tensor) -> Tensor:
        lr, (beta1, beta2), eps, weight_decay = self.group["lr"], self.group["betas"], self.group["eps"], self.group["weight_decay"]
        step = started.double() + 1  # bias corrections in double precision, as torch.optim computes them in Python floats
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = lr / (1 - beta1**step)
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        denom = (exp_avg_sq.sqrt() / _per_model(bias_correction2_sqrt, param)).add_(eps)
        param.add_(_per_model(-step_size, param) * exp_avg / denom)  # addcdiv's order: value * t1 / t2
        return step.to(started.dtype)

    def _state_of(self, k: int, name: str) -> dict:
        return {
            "step": torch.tensor(float(self.started[name][k])),
            "exp_avg": self.state["exp_avg"][name][k].clone(),
            "exp_avg_sq": self.state["exp_avg_sq"][name][k].clone(),
        }


class StackedSGD(_StackedOptimizer):
    """``torch.optim.SGD`` with weight decay, momentum (dampening 0) and Nesterov."""

    state_keys = ("momentum_buffer",)

    def _started(self, state: dict) -> float:
        return float(state.get("momentum_buffer") is not None)

    def _step(self, param: Tensor, grad: Tensor, state: dict[str, Tensor], started: Tensor) -> Tensor:
        lr, momentum, weight_decay = self.group["lr"], self.group["momentum"], self.group["weight_decay"]
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        if momentum != 0:
            buf = state["momentum_buffer"]
            buf.copy_(torch.where(_per_model(started, param).bool(), buf.mul(momentum).add(grad), grad))  # the first step clones grad
            grad = grad.add(buf, alpha=momentum) if self.group["nesterov"] else buf
        param.add_(grad, alpha=-lr)
        return torch.ones_like(started) if momentum != 0 else started

    def _state_of(self, k: int, name: str) -> dict:
        if self.group["momentum"] == 0:
            return {}
        return {"momentum_buffer": self.state["momentum_buffer"][name][k].clone()}


def stacked_optimizer(optimizers: Sequence[torch.optim.Optimizer], names: Sequence[str], params: dict[str, Tensor]) -> _StackedOptimizer:
    """:class:`StackedAdam` or :class:`StackedSGD` over ``optimizers`` (one per model, parameters in ``names`` order)."""
    kind = StackedAdam if isinstance(optimizers[0], torch.optim.Adam) else StackedSGD
    return kind(optimizers, names, params)


# ---------------------------------------------------------------------------------------------------- training
