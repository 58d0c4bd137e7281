"""Walk everything reachable from an object: attributes, slots, closure cells, bound methods, partials, containers.

Module globals (``function.__globals__``) and classes are not followed: they are code, shared by everyone,
not state an object was handed.
"""

from __future__ import annotations

import functools
import types
from collections import deque
from typing import Iterator

import torch

_ATOMS = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size)


def _children(obj: object) -> Iterator[object]:
    if isinstance(obj, dict) or isinstance(obj, types.MappingProxyType):
        yield from obj.keys()
        yield from obj.values()
        return
    if isinstance(obj, (list, tuple, set, frozenset, deque)):
        yield from obj
        return
    if isinstance(obj, types.MethodType):
        yield obj.__self__
        yield obj.__func__
        return
    if isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                yield cell.cell_contents
            except ValueError:  # an empty cell
                pass
        yield from obj.__defaults__ or ()
        yield from (obj.__kwdefaults__ or {}).values()
        return
    if isinstance(obj, functools.partial):
        yield obj.func
        yield from obj.args
        yield from obj.keywords.values()
        return
    if torch.is_tensor(obj):
        return
    if hasattr(obj, "__dict__"):
        yield from vars(obj).values()
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                yield getattr(obj, slot)


def reachable(*roots: object, limit: int = 500_000, atoms: bool = False) -> Iterator[object]:
    """Every object reachable from ``roots`` (each once), breadth first; with ``atoms``, the numbers, strings and bytes
    met on the way too (a secret can be an int, such as a seed, or bytes, such as a digest)."""
    seen: set[int] = set()
    queue = deque(roots)
    while queue:
        obj = queue.popleft()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType)):
            continue
        if isinstance(obj, _ATOMS):
            if atoms:
                seen.add(id(obj))
                yield obj
            continue
        seen.add(id(obj))
        if len(seen) > limit:
            raise RuntimeError(f"more than {limit} objects reachable; the walk is not bounded")
        yield obj
        queue.extend(_children(obj))
