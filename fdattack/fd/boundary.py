"""What an attack hands across the attacker boundary becomes plain data: a plain, detached copy of each tensor.

An attack that hands the protocol or the evaluation side a ``torch.Tensor`` subclass with ``__torch_function__`` runs
its own code with every other argument of each torch call the other side makes with it: a client's live parameters
when the protocol runs a network on the attack's images, the ground truth when the evaluator compares. Everything an
attack passes in (images to query or add, chosen rows, chosen aggregates, query indices, its results) goes through
:func:`plain_tensor` first, which tells such objects by their type alone (reading a type runs none of their code),
refuses them with one line, and returns a copy, so that nothing the attack keeps aliases what the other side uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

T = TypeVar("T")


class BoundaryError(TypeError):
    """An attack handed the other side something that is not plain data (a tensor subclass, an object array)."""


def plain_tensor(value: Any, what: str) -> Tensor:
    """A detached copy of ``value`` as a plain ``torch.Tensor`` on its device.

    ``value`` may be a plain tensor, an ``nn.Parameter`` (its data), a Python number or a sequence or NumPy array of
    numbers.

    Raises:
        BoundaryError: a tensor subclass, or anything that is not numbers, naming ``what``.
    """
    kind = type(value)
    if kind is torch.nn.Parameter:
        value = value.data
    elif kind is not Tensor:
        if isinstance(value, Tensor) or not isinstance(value, (bool, int, float, list, tuple, np.ndarray)):
            raise BoundaryError(f"{what} must be a plain torch.Tensor or numbers, not {kind.__module__}.{kind.__qualname__}")
        array = np.asarray(value)
        if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
            raise BoundaryError(f"{what} must hold numbers only, not {array.dtype}")
        return torch.from_numpy(array.copy())
    return value.detach().clone()


def plain_result(result: T, result_types: tuple[type, ...], attack: str) -> T:
    """``result`` with each tensor field a plain copy (:func:`plain_tensor`); it must be exactly one of ``result_types``.

    Raises:
        BoundaryError: another type (a subclass too: its properties would run the attack's code on the evaluation
            side), or a field that is not plain data.
    """
    if type(result) not in result_types:
        raise BoundaryError(
            f"attack {attack} returned a {type(result).__module__}.{type(result).__qualname__}; results must be "
            f"exactly one of {', '.join(t.__name__ for t in result_types)}"
        )
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}  # type: ignore[arg-type]
    plain = {
        name: plain_tensor(value, f"attack {attack}'s {type(result).__name__}.{name}")
        for name, value in fields.items()
        if isinstance(value, Tensor)
    }
    return dataclasses.replace(result, **plain) if plain else result  # type: ignore[type-var]
