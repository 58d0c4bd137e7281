"""Config fields that document and check themselves: :func:`knob`, :class:`Choice`, :func:`check_ranges`.

Every component's settings are one dataclass whose fields are declared with :func:`knob`: the default,
the help text that ``fdattack run --help-config`` prints, and the allowed range, side by side. Fields
with a fixed set of values are :class:`Choice` enums, which OmegaConf validates on merge.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterator, Optional

from omegaconf import DictConfig, OmegaConf

from fdattack.errors import ConfigError


class Choice(str, Enum):
    """A config choice: OmegaConf checks the value against the members; it compares and prints as its string."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


@dataclass(frozen=True)
class Range:
    """Bounds of a numeric field (None = unbounded); ``None`` values pass (Optional fields are typed).

    ``finite`` (the default) refuses inf and NaN, which OmegaConf accepts for float fields; a knob where
    inf means something opts out with ``finite=False``.
    """

    gt: Optional[float] = None
    ge: Optional[float] = None
    lt: Optional[float] = None
    le: Optional[float] = None
    finite: bool = True
    among: Optional[tuple[Any, ...]] = None

    def admits(self, value: Any) -> bool:
        if value is None:
            return True
        if self.among is not None:
            return value in self.among
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.finite and not math.isfinite(value):
                return False
            return not (
                (self.gt is not None and not value > self.gt)
                or (self.ge is not None and not value >= self.ge)
                or (self.lt is not None and not value < self.lt)
                or (self.le is not None and not value <= self.le)
            )
        return True

    def describe(self) -> str:
        """The bounds in words (``> 0``, ``[0, 1)``); finiteness is implied and not spelled out."""
        if self.among is not None:
            return " or ".join(repr(v) for v in self.among)
        low = f"> {_number(self.gt)}" if self.gt is not None else f">= {_number(self.ge)}" if self.ge is not None else ""
        high = f"< {_number(self.lt)}" if self.lt is not None else f"<= {_number(self.le)}" if self.le is not None else ""
        if low and high:
            left, lower = ("(", self.gt) if self.gt is not None else ("[", self.ge)
            right, upper = (")", self.lt) if self.lt is not None else ("]", self.le)
            return f"{left}{_number(lower)}, {_number(upper)}{right}"
        return low or high


def _number(bound: float) -> str:
    """A bound as written: ``0``, ``0.5``, ``1e-06``, ``4294967295`` (whole numbers in full)."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def knob(
    default: Any,
    help: str,
    *,
    gt: Optional[float] = None,
    ge: Optional[float] = None,
    lt: Optional[float] = None,
    le: Optional[float] = None,
    finite: bool = True,
    among: Optional[tuple[Any, ...]] = None,
) -> Any:
    """A dataclass field with its help text and allowed range (a list or dataclass default is copied per instance).

    Numbers are finite unless ``finite=False`` (inf and NaN are refused like any out-of-range value).
    """
    metadata = {"help": help, "range": Range(gt, ge, lt, le, finite, among)}
    if isinstance(default, list) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda: _copy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _copy(value: Any) -> Any:
    return copy.deepcopy(value)


def help_of(f: dataclasses.Field) -> str:
    return str(f.metadata.get("help", ""))


def _leaves(node: Any, prefix: str) -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """(key, field, value) of every leaf of a dataclass instance or a config node typed by one."""
    schema = node if dataclasses.is_dataclass(node) else OmegaConf.get_type(node)
    for f in dataclasses.fields(schema):  # type: ignore[arg-type]
        value = getattr(node, f.name)
        if value is not None and (dataclasses.is_dataclass(value) or _is_structured(value)):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, value


def _is_structured(value: Any) -> bool:
    return isinstance(value, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(value))


def check_ranges(node: Any, prefix: str) -> None:
    """Check every field of ``node`` (dataclass or typed config node) against its :func:`knob` range.

    Raises:
        ConfigError: ``<prefix><key>=<value> is out of range; allowed: <range>`` for the first offender.
    """
    for key, f, value in _leaves(node, prefix):
        bounds: Optional[Range] = f.metadata.get("range")
        if bounds is not None and not bounds.admits(value):
            raise ConfigError(f"{key}={value!r} is out of range; allowed: {_allowed(f, bounds, value)}")


def _allowed(f: dataclasses.Field, bounds: Range, value: Any) -> str:
    """The range in words: ``an integer >= 1``, ``null or a number > 0``, ``(0, 1)``, ``a finite number > 0`` ..."""
    text = bounds.describe()
    interval = text.startswith(("(", "["))
    if isinstance(value, float) and not math.isfinite(value):
        text = f"a finite number in {text}" if interval else f"a finite number {text}".strip()
    elif bounds.among is None and not interval:
        text = ("an integer " if isinstance(value, int) and not isinstance(value, bool) else "a number ") + text
    return f"null or {text}" if "Optional" in str(f.type) else text


def describe_default(value: Any) -> str:
    return str(value) if isinstance(value, Choice) else repr(value)


def field_docs(schema: type, prefix: str, instance: Any = None) -> list[tuple[str, str, str]]:
    """(key, default, help) of every documented leaf field of a settings dataclass, nested ones flattened.

    Args:
        instance: read the defaults from this instance (a nested field's own default) instead of the class.
    """
    rows: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(schema):
        if "help" not in f.metadata:
            continue  # filled from a registry (protocol, attack, defense) and documented there
        if instance is not None:
            default = getattr(instance, f.name)
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            rows.extend(field_docs(type(default), f"{prefix}{f.name}.", default))
            continue
        text = help_of(f)
        bounds: Optional[Range] = f.metadata.get("range")
        if isinstance(default, Choice):
            text += f" [{' | '.join(m.value for m in type(default))}]"
        elif bounds is not None and bounds.describe():
            text += f" [{bounds.describe()}]"
        rows.append((f"{prefix}{f.name}", describe_default(default), text))
    return rows
