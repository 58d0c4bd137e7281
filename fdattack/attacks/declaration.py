"""What the run reads of an attack's class, as plain data: the view parts it reads, what it needs, the server powers it
is granted and the result types it returns.

The run decides from these what to build around an attack (the candidates it draws, the view parts it copies, the
adversary it grants, the scorers of the evaluation side) and never calls into the class for them. Under
``isolation.mode=process`` they are read in a confined process that holds nothing of the run (the workers' zygote's
child: :meth:`fdattack.isolation.Zygote.declare`) and travel to the run as names; in process they are read in the run,
which is no sandbox. Settings travel as a plain dict and become the class's ``Settings`` only where the attack runs
(:func:`settings_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from omegaconf import OmegaConf

from fdattack.fd import results as results_module
from fdattack.fd.threat import Capability, ViewPart

E = TypeVar("E", bound=Enum)


class DeclarationError(TypeError):
    """An attack class whose declarations are not what the contract says (a frozenset of the named kind's members)."""


@dataclass(frozen=True)
class Declaration:
    """An attack's declarations for its settings (:class:`~fdattack.attacks.base.Attack`'s ``reads``, ``required``,
    ``adversary_powers`` and ``produces``), each a frozenset of plain members."""

    reads: frozenset[ViewPart]
    needs: frozenset[Capability]
    powers: frozenset[Capability]
    produces: frozenset[type]

    def to_names(self) -> dict[str, list[str]]:
        """Each set as sorted names (what a declaring process sends the run)."""
        return {
            "reads": sorted(p.value for p in self.reads),
            "needs": sorted(c.value for c in self.needs),
            "powers": sorted(c.value for c in self.powers),
            "produces": sorted(t.__name__ for t in self.produces),
        }

    @classmethod
    def from_names(cls, names: Any) -> "Declaration":
        """:meth:`to_names` undone, taking only known names.

        Raises:
            DeclarationError: anything but lists of known names under the four keys.
        """
        if type(names) is not dict or set(names) != {"reads", "needs", "powers", "produces"}:
            raise DeclarationError("a declaration that is not the four lists reads, needs, powers and produces")
        types = {kind.__name__: kind for kind in results_module.RESULT_TYPES}
        return cls(
            reads=_named(names["reads"], {p.value: p for p in ViewPart}, "reads"),
            needs=_named(names["needs"], {c.value: c for c in Capability}, "needs"),
            powers=_named(names["powers"], {c.value: c for c in Capability}, "powers"),
            produces=_named(names["produces"], types, "produces"),
        )


def _named(names: Any, known: dict[str, Any], what: str) -> frozenset:
    if type(names) is not list or not all(type(n) is str and n in known for n in names):
        raise DeclarationError(f"{what} that are not names of known members ({', '.join(sorted(known))})")
    return frozenset(known[n] for n in names)


def settings_of(cls: type, plain: dict[str, Any]) -> Any:
    """The attack's ``Settings`` instance made from ``plain`` (``attack.<name>`` as a plain dict)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls.Settings), plain))


def declare(cls: Any, plain: dict[str, Any]) -> Declaration:
    """Attack class ``cls``'s declarations with settings ``plain``, checked to be plain and copied.

    Raises:
        DeclarationError: a declaration that is not a frozenset of its kind's members (a set of the attack's own making,
            whose iteration or membership test would run its code wherever it is read).
    """
    settings = settings_of(cls, plain)
    needs = _members(cls.required(settings), Capability, "required(settings)")
    powers = _members(cls.adversary_powers(settings), Capability, "adversary_powers(settings)")
    produced = cls.produces
    if type(produced) is not frozenset or not all(any(t is kind for kind in results_module.RESULT_TYPES) for t in produced):
        raise DeclarationError(f"{cls.__name__}.produces is not a frozenset of the result types")
    return Declaration(_members(cls.reads, ViewPart, "reads"), needs, powers, frozenset(produced))


def _members(value: Any, kind: type[E], what: str) -> frozenset[E]:
    if type(value) is not frozenset or not all(type(member) is kind for member in value):
        raise DeclarationError(f"{what} is not a frozenset of {kind.__name__} members")
    return frozenset(kind(member.value) for member in value)
