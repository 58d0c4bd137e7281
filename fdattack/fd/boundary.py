"""What an attack hands across the attacker boundary becomes plain data, rebuilt by exact type.

An attack that hands the protocol or the evaluation side an object of its own class runs its own code wherever the other
side uses it: a ``torch.Tensor`` subclass's ``__torch_function__`` sees every other argument of each torch call made
with it (a client's live parameters when the protocol runs a network on the attack's images, the ground truth when the
evaluator compares); a ``str`` subclass's ``__eq__`` runs inside the scorer that compares it; an object's ``__array__``
runs inside ``np.asarray``. Everything an attack passes in (images to query or add, chosen rows, chosen aggregates,
query indices, its results field by field) is told by its exact type alone (``type(value) is ...``: reading a type runs
none of its code, where ``isinstance``, ``==`` and hashing can) and rebuilt as plain data (:func:`plain_tensor`,
:func:`plain_value`, :func:`plain_result`); anything else is refused with one line, and nothing the attack keeps aliases
what the other side uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

T = TypeVar("T")

#: the dtypes a plain tensor may have (no complex, quantized or other exotic kinds)
TENSOR_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)
_NUMBERS = (bool, int, float)
_NUMPY_NUMBERS = (
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
)
_MAX_DEPTH = 8  # nesting of lists, tuples and dicts


class BoundaryError(TypeError):
    """An attack handed the other side something that is not plain data (a tensor subclass, an object array)."""


def _one_of(kind: type, kinds: tuple[type, ...]) -> bool:
    """Whether ``kind`` is exactly one of ``kinds``, by identity (``in`` and sets would run a metaclass's ``__eq__`` or
    ``__hash__``)."""
    return any(kind is k for k in kinds)


def type_name(kind: type) -> str:
    """``module.qualname`` of ``kind``, read through ``type``'s own descriptors so that no metaclass code runs; a name
    that is not a plain ``str`` (its formatting would run code) is not shown."""
    module, name = type.__dict__["__module__"].__get__(kind), type.__dict__["__qualname__"].__get__(kind)
    return f"{module}.{name}" if type(module) is str and type(name) is str else "type with an unprintable name"


def _numbers(value: Any, what: str, depth: int = 0) -> None:
    """Check that ``value`` is a number or a (nested) plain list or tuple of numbers, by exact type."""
    kind = type(value)
    if _one_of(kind, _NUMBERS) or _one_of(kind, _NUMPY_NUMBERS):
        return
    if (kind is list or kind is tuple) and depth < _MAX_DEPTH:
        for item in value:
            _numbers(item, what, depth + 1)
        return
    raise BoundaryError(f"{what} must be a plain torch.Tensor or numbers (a plain list, tuple or NumPy array), not {type_name(kind)}")


def plain_tensor(value: Any, what: str) -> Tensor:
    """A detached, contiguous copy of ``value`` as a plain ``torch.Tensor`` on its device.

    ``value`` may be a plain tensor, an ``nn.Parameter`` (its data), a number, a plain list or tuple of numbers, or a
    plain NumPy array of numbers; each is told by its exact type, and nothing of it is called (no ``__array__``, no
    ``__index__``, no ``__iter__`` of a subclass).

    Raises:
        BoundaryError: a tensor subclass, any other object, or an unsupported dtype, naming ``what``.
    """
    kind = type(value)
    if kind is torch.nn.Parameter:
        value = value.data
    elif kind is np.ndarray:
        if value.dtype.kind not in "biuf":
            raise BoundaryError(f"{what} must hold numbers only, not {value.dtype}")
        return torch.from_numpy(value.copy())
    elif kind is not Tensor:
        _numbers(value, what)
        try:
            array = np.asarray(value)  # plain numbers only: NumPy calls nothing of the attack's
        except ValueError as err:
            raise BoundaryError(f"{what}: {err}") from None
        return torch.from_numpy(array.copy())
    if value.layout is not torch.strided or not any(value.dtype is d for d in TENSOR_DTYPES):
        raise BoundaryError(f"{what} must be a dense tensor of a real or integer dtype, not {value.layout} {value.dtype}")
    return value.detach().clone(memory_format=torch.contiguous_format)


def plain_value(value: Any, what: str, depth: int = 0) -> Any:
    """``value`` rebuilt by exact type: ``None``, a plain ``str``, ``int``, ``float`` or ``bool`` (a NumPy number becomes
    the Python one), a plain tensor (:func:`plain_tensor`), or a plain list, tuple or dict (``str`` keys) of them.

    Raises:
        BoundaryError: anything else (a subclass of any of these too), naming ``what``.
    """
    kind = type(value)
    if value is None or kind is str or _one_of(kind, _NUMBERS):
        return value
    if _one_of(kind, _NUMPY_NUMBERS):
        return value.item()
    if kind is Tensor or kind is torch.nn.Parameter:
        return plain_tensor(value, what)
    if depth < _MAX_DEPTH and (kind is list or kind is tuple):
        return kind(plain_value(item, f"{what}[{i}]", depth + 1) for i, item in enumerate(value))
    if depth < _MAX_DEPTH and kind is dict:
        plain = {}
        for key, item in value.items():
            if type(key) is not str:
                raise BoundaryError(f"{what} must have plain str keys, not {type_name(type(key))}")
            plain[key] = plain_value(item, f"{what}[{key!r}]", depth + 1)
        return plain
    raise BoundaryError(
        f"{what} must be a plain torch.Tensor, str, int, float, bool or None, or a list, tuple or dict of them, not {type_name(kind)}"
    )


def plain_result(result: T, result_types: tuple[type, ...], attack: str) -> T:
    """``result`` rebuilt field by field by exact type (:func:`plain_value`); it must be exactly one of ``result_types``.

    Raises:
        BoundaryError: another type (a subclass too: its properties would run the attack's code on the evaluation
            side), or a field that is not plain data, naming the attack and the field.
    """
    kind = type(result)
    if not _one_of(kind, result_types):
        raise BoundaryError(
            f"attack {attack} returned a {type_name(kind)}; results must be exactly one of {', '.join(t.__name__ for t in result_types)}"
        )
    fields = dataclasses.fields(kind)  # type: ignore[arg-type]
    return kind(**{f.name: plain_value(getattr(result, f.name), f"attack {attack}'s {kind.__name__}.{f.name}") for f in fields})
