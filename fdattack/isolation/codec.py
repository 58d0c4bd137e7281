"""Plain data as bytes, and back: what an attack's worker sends the protocol side.

Pickle runs whatever callable a message names while it is read, so the protocol side never unpickles what a worker
sends. A worker's message is encoded here instead: a JSON header that holds ``None``, ``bool``, ``int``, ``float``,
``str``, lists, tuples and ``str``-keyed dicts of them, ``bytes``, and dense tensors of a real or integer dtype, whose
raw bytes follow the header. Decoding builds nothing but those types; anything else in a header is a
:class:`CodecError`. The worker encodes through :func:`~fdattack.fd.boundary.plain_value`, so an attack that returns an
object of its own class is told so in its own process.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import torch
from torch import Tensor

from fdattack.fd.boundary import TENSOR_DTYPES

_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in TENSOR_DTYPES}
_HEADER = struct.Struct("<Q")  # the header's length in bytes
_MAX_DEPTH = 16
#: the most a worker may send in one message without a memory budget (with one: the budget); a longer one is refused
#: before it is read
MAX_MESSAGE_BYTES = 1 << 32
#: the most elements a tensor field may claim (its bytes must be there too)
_MAX_NUMEL = 1 << 40


class CodecError(ValueError):
    """A message that is not plain data (a worker that sent something of its own making)."""


def encode(value: Any) -> bytes:
    """``value`` (plain data only: see the module docstring) as bytes for :func:`decode`."""
    buffers: list[bytes] = []
    header = json.dumps(_to_json(value, buffers, 0), allow_nan=True, separators=(",", ":")).encode()
    return b"".join([_HEADER.pack(len(header)), header, *buffers])


def decode(message: bytes | bytearray) -> Any:
    """The plain data :func:`encode` made; :class:`CodecError` for anything else."""
    if len(message) < _HEADER.size:
        raise CodecError("a message shorter than its header")
    (length,) = _HEADER.unpack_from(message)
    if length > len(message) - _HEADER.size:
        raise CodecError("a message whose header runs past its end")
    try:
        header = json.loads(message[_HEADER.size : _HEADER.size + length])
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise CodecError(f"a message whose header is not JSON ({err})") from None
    body = memoryview(message)[_HEADER.size + length :]
    offset = [0]
    value = _from_json(header, body, offset, 0)
    if offset[0] != len(body):
        raise CodecError("a message with bytes no field accounts for")
    return value


def _to_json(value: Any, buffers: list[bytes], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise CodecError("data nested too deep")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return {"i": str(value)}  # JSON numbers would lose big ints' digits in some readers
    if kind is float:
        return {"f": repr(value)} if not math.isfinite(value) else value
    if kind is bytes:
        buffers.append(value)
        return {"b": len(value)}
    if kind is Tensor:
        if value.layout is not torch.strided or not any(value.dtype is d for d in TENSOR_DTYPES):
            raise CodecError(f"a tensor of layout {value.layout} and dtype {value.dtype}")
        flat = value.detach().cpu().contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        buffers.append(raw)
        return {"t": str(value.dtype).removeprefix("torch."), "s": list(value.shape), "n": len(raw)}
    if kind is list or kind is tuple:
        return {"l" if kind is list else "u": [_to_json(item, buffers, depth + 1) for item in value]}
    if kind is dict:
        if not all(type(key) is str for key in value):
            raise CodecError("a dict with keys that are not plain str")
        return {"d": {key: _to_json(item, buffers, depth + 1) for key, item in value.items()}}
    raise CodecError(f"a {kind.__qualname__} is not plain data")


def _take(body: memoryview, offset: list[int], size: object) -> bytes:
    if type(size) is not int or size < 0 or offset[0] + size > len(body):
        raise CodecError("a field whose size runs past the message")
    start = offset[0]
    offset[0] += size
    return bytes(body[start : start + size])


def _from_json(node: Any, body: memoryview, offset: list[int], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise CodecError("data nested too deep")
    kind = type(node)
    if node is None or kind is bool or kind is str or kind is float:
        return node
    if kind is not dict or len(node) not in (1, 3):
        raise CodecError("a header node of no known kind")
    if "i" in node and len(node) == 1 and type(node["i"]) is str:
        try:
            return int(node["i"])
        except ValueError:
            raise CodecError("an int field that is not a number") from None
    if "f" in node and len(node) == 1 and node["f"] in ("nan", "inf", "-inf"):
        return float(node["f"])
    if "b" in node and len(node) == 1:
        return _take(body, offset, node["b"])
    if "t" in node and len(node) == 3:
        return _tensor(node, body, offset)
    if ("l" in node or "u" in node) and len(node) == 1:
        items = node.get("l", node.get("u"))
        if type(items) is not list:
            raise CodecError("a list field that is not a list")
        decoded = [_from_json(item, body, offset, depth + 1) for item in items]
        return decoded if "l" in node else tuple(decoded)
    if "d" in node and len(node) == 1 and type(node["d"]) is dict:
        return {key: _from_json(item, body, offset, depth + 1) for key, item in node["d"].items()}
    raise CodecError("a header node of no known kind")


def _tensor(node: dict, body: memoryview, offset: list[int]) -> Tensor:
    dtype, shape = _DTYPES.get(node.get("t")) if type(node.get("t")) is str else None, node.get("s")
    sizes_ok = type(shape) is list and len(shape) <= _MAX_DEPTH and all(type(d) is int and 0 <= d <= _MAX_NUMEL for d in shape)
    if dtype is None or not sizes_ok:
        raise CodecError("a tensor field of no known dtype or shape")
    raw = _take(body, offset, node.get("n"))
    numel = math.prod(shape)
    if numel > _MAX_NUMEL or len(raw) != numel * torch.empty((), dtype=dtype).element_size():
        raise CodecError("a tensor field whose bytes do not fit its shape")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone()
