"""The attack contract: an observer of round records, built from an :class:`~fdattack.fd.threat.AttackerView`.

An attack is one registered class (``@ATTACKS.register("name")``) with its ``Settings`` dataclass
(the knobs under ``attack.<name>``, defaults and help text in one place) and the capabilities it
needs (:class:`~fdattack.fd.threat.Capability`), which the config checks against what the protocol
offers. Everything else it gets from the run comes in an :class:`AttackContext`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from fdattack.attacks.results import AttackResult
from fdattack.attacks.state_store import ClientStateStore
from fdattack.engine import LocalTrainer
from fdattack.fd.adversary import Adversary
from fdattack.fd.observer import Observer
from fdattack.fd.threat import AttackerView, Capability, ViewPart
from fdattack.registry import Registry
from fdattack.tracking.artifact_cache import AttackCache
from fdattack.vocabulary import SERVER_POWERS


@dataclass
class AttackContext:
    """What the run lends an attack besides its view and settings.

    Attributes:
        seed: the attacker's seed (:func:`fdattack.assembly.attacker_seed`: derived from the run's ``attack_seed``,
            never the run seed, from which the run's secrets derive); each attack derives its own streams from it and its
            name, and attacks that train the same network (VMI trains GMI's prior) train it from the same seed.
        store: where per-client training state waits between rounds (memory by default).
        progress: progress bars over the attack's training: auto | always | never.
        engine: the run's engine (``trainer.accelerator``/``precision``/DDP); None = a single CPU process.
        adversary: the active powers granted (only to attacks that need one), or None.
        cache: where the attack keeps networks that depend only on its view's public part, its settings and its seed
            (PLI's learned prior, a GAN prior) and finds them again in later runs (``cache_dir``; ``fetch`` only, no
            path); None: trained every run.
    """

    seed: int
    store: ClientStateStore = field(default_factory=ClientStateStore)
    progress: str = "never"
    engine: Optional[LocalTrainer] = None
    adversary: Optional[Adversary] = None
    cache: Optional[AttackCache] = None


class Attack(Observer):
    """An attack sees the records its threat model grants and returns typed results; it never scores itself.

    Subclasses collect what they need in :meth:`on_record` (a record's query answers only during its
    phase) and do their work in :meth:`on_round_end`.

    Args:
        view: what the attacker knows.
        settings: an instance of :attr:`Settings`.
        context: seed, state store, progress, engine and adversary.
    """

    name: ClassVar[str] = "attack"
    #: the attack's knobs (``attack.<name>.*``)
    Settings: ClassVar[type]
    #: what the attack needs from the protocol, whatever its settings
    needs: ClassVar[frozenset[Capability]] = frozenset()
    #: the fewest clients it works with, and why (checked with the needs, before a run or a matrix cell starts)
    min_clients: ClassVar[tuple[int, str]] = (1, "")
    #: the result types it returns (the run builds the evaluation side's scorers for them)
    produces: ClassVar[frozenset[type]] = frozenset()
    #: the parts of the attacker's view it reads (its own view holds no other; :meth:`~fdattack.fd.threat.AttackerView.for_attack`);
    #: ``ViewPart.candidates`` also makes the run draw membership candidates
    reads: ClassVar[frozenset[ViewPart]] = frozenset()

    def __init__(self, view: AttackerView, settings: Any, context: AttackContext) -> None:
        self.view = view
        self.settings = settings
        self.context = context

    @classmethod
    def required(cls, settings: Any) -> frozenset[Capability]:
        """What the attack needs with these settings (:attr:`needs` unless a setting adds to it)."""
        return cls.needs

    @classmethod
    def adversary_powers(cls, settings: Any) -> frozenset[Capability]:
        """The server powers among :meth:`required` (an :class:`Adversary` is granted when any)."""
        return cls.required(settings) & SERVER_POWERS

    def on_round_end(self, round: int) -> list[AttackResult]:
        """Called once per round after its last phase; the results go to the evaluation side."""
        return []


ATTACKS: Registry[type[Attack]] = Registry("attack", "attacks")
