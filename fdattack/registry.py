"""Name-keyed registries filled by decorator; an unknown name lists the known ones."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from fdattack.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from a lowercase snake_case name to a class or factory.

    Args:
        kind: what the registry holds, used in error messages (e.g. ``"protocol"``).
        key: the config key that selects from it (e.g. ``"protocol.name"``).
    """

    def __init__(self, kind: str, key: str) -> None:
        self.kind = kind
        self.key = key
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that adds ``obj`` under ``name``."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return add

    def get(self, name: str, key: str | None = None) -> T:
        """Return the entry for ``name`` or raise :class:`ConfigError` listing the known names.

        Args:
            key: the config key that named it, where it is not the registry's own (``model.clients[1]``).
        """
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise ConfigError(f"{key or self.key}={name!r} is not a known {self.kind}; choose one of: {known}") from None

    def items(self) -> list[tuple[str, T]]:
        return [(name, self._items[name]) for name in self.names()]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
